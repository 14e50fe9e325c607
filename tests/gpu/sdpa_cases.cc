// dfa_sdpa_cases DIR [--fwd-kernel ...] [--bwd-kernel ...] [--bwd-tile-chunk N]: runs the CUDA
// backend's forward and backward over a grid of unit shapes and writes, per case, the inputs and
// our outputs as raw little-endian files plus one line of DIR/cases.txt, for
// tests/gpu/sdpa_check.py to compare against PyTorch SDPA on the GPU machine. The flags override
// the kernel table (tests/gpu/kernel_flags.h), so that every kernel can be checked.
//   cases.txt line: id dtype head_dim batch m n q_heads kv_heads q_row0 kv_row0 causal scale
//   case<id>_{q,k,v,do}.bin: 2-byte elements (dtype), BSHD dense
//   case<id>_{out,lse,dq,dk,dv}.bin: fp32 (out BSHD, lse BHS, grads BSHD)
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/attention_backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/gpu/kernel_flags.h"
#include "tests/gpu/unit_inputs.h"

namespace dfa {
namespace {

bool WriteFile(const std::string& path, const void* data, size_t bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  const bool ok = std::fwrite(data, 1, bytes, f) == bytes;
  return std::fclose(f) == 0 && ok;
}

int Main(int argc, char** argv) {
  std::string dir;
  cuda::KernelChoice choice;
  for (int i = 1; i < argc; ++i) {
    std::string error;
    if (testing::ParseKernelFlag(argc, argv, &i, &choice, &error)) {
      if (!error.empty()) {
        std::fprintf(stderr, "%s\n", error.c_str());
        return 2;
      }
    } else if (dir.empty() && argv[i][0] != '-') {
      dir = argv[i];
    } else {
      dir.clear();
      break;
    }
  }
  if (dir.empty()) {
    std::fprintf(stderr,
                 "usage: dfa_sdpa_cases DIR [--fwd-kernel K] [--bwd-kernel K] [--bwd-tile-chunk N]\n");
    return 2;
  }
  auto be_or = CreateCudaBackend({}, choice);
  if (!be_or.ok()) {
    std::fprintf(stderr, "cuda backend: %s\n", be_or.status().ToString().c_str());
    return 2;
  }
  AttentionBackend& be = **be_or;
  using testing::UnitShape;
  std::vector<UnitShape> cases;
  for (DType t : {DType::kBF16, DType::kF16})
    for (int d : {64, 128})
      for (MaskKind mk : {MaskKind::kCausal, MaskKind::kFull}) {
        UnitShape s;
        s.dtype = t, s.head_dim = d, s.mask = mk;
        s.m = 333, s.n = 517, s.q_heads = 8, s.kv_heads = 2, s.q_row0 = 400, s.kv_row0 = 0;
        cases.push_back(s);
        s.m = 1000, s.n = 1000, s.q_heads = 4, s.kv_heads = 4, s.q_row0 = 0, s.kv_row0 = 0, s.batch = 2;
        cases.push_back(s);
      }
  FILE* meta = std::fopen((dir + "/cases.txt").c_str(), "w");
  if (!meta) {
    std::fprintf(stderr, "cannot write %s/cases.txt\n", dir.c_str());
    return 1;
  }
  int id = 0;
  for (const UnitShape& s : cases) {
    const size_t nq = size_t(s.batch) * s.m * s.q_heads * s.head_dim;
    const size_t nk = size_t(s.batch) * s.n * s.kv_heads * s.head_dim;
    const size_t ns = size_t(s.batch) * s.q_heads * s.m;
    std::vector<uint16_t> qb, kb, vb, db;
    testing::RandomRounded(nq, s.dtype, 1000 + id * 7, &qb);
    testing::RandomRounded(nk, s.dtype, 1001 + id * 7, &kb);
    testing::RandomRounded(nk, s.dtype, 1002 + id * 7, &vb);
    testing::RandomRounded(nq, s.dtype, 1003 + id * 7, &db);
    auto up = [&](const void* h, size_t bytes) {
      void* p = *be.Alloc(bytes);
      (void)be.Copy(p, h, bytes, AttentionBackend::CopyKind::kHostToDevice, nullptr);
      return p;
    };
    void* q = up(qb.data(), nq * 2);
    void* k = up(kb.data(), nk * 2);
    void* v = up(vb.data(), nk * 2);
    void* dout = up(db.data(), nq * 2);
    float* out = static_cast<float*>(*be.Alloc(nq * 4));
    float* lse = static_cast<float*>(*be.Alloc(ns * 4));
    float* delta = static_cast<float*>(*be.Alloc(ns * 4));
    float* dq = static_cast<float*>(*be.Alloc(nq * 4));
    float* dk = static_cast<float*>(*be.Alloc(nk * 4));
    float* dv = static_cast<float*>(*be.Alloc(nk * 4));
    (void)be.Memset(dq, 0, nq * 4, nullptr);
    (void)be.Memset(dk, 0, nk * 4, nullptr);
    (void)be.Memset(dv, 0, nk * 4, nullptr);
    TensorView tq{q, s.dtype, s.batch, s.m, s.q_heads, s.head_dim};
    TensorView tk{k, s.dtype, s.batch, s.n, s.kv_heads, s.head_dim};
    RowStatView st{lse, s.batch, s.q_heads, s.m};
    ForwardArgs f;
    f.scale = 1.f / std::sqrt(float(s.head_dim));
    f.mask = s.mask, f.q_row0 = s.q_row0, f.kv_row0 = s.kv_row0;
    f.q = tq, f.k = tk, f.v = tk, f.v.data = v;
    f.out = tq, f.out.data = out, f.out.dtype = DType::kF32;
    f.lse = st;
    BackwardArgs b;
    b.scale = f.scale, b.mask = s.mask, b.q_row0 = s.q_row0, b.kv_row0 = s.kv_row0;
    b.q = f.q, b.k = f.k, b.v = f.v, b.dout = tq, b.dout.data = dout, b.lse = st;
    b.delta = st, b.delta.data = delta;
    b.dq = f.out, b.dq.data = dq;
    b.dk = tk, b.dk.dtype = DType::kF32, b.dk.data = dk;
    b.dv = b.dk, b.dv.data = dv;
    absl::Status status = be.Forward(f);
    if (status.ok()) status = be.ComputeDelta(b.dout, f.out, b.delta, nullptr);
    if (status.ok()) status = be.Backward(b);
    if (status.ok()) status = be.Synchronize(nullptr);
    if (!status.ok()) {
      std::fprintf(stderr, "case %d: %s\n", id, status.ToString().c_str());
      return 1;
    }
    auto down = [&](const void* dev, size_t bytes, const char* name) {
      std::vector<char> h(bytes);
      (void)be.Copy(h.data(), dev, bytes, AttentionBackend::CopyKind::kDeviceToHost, nullptr);
      (void)be.Synchronize(nullptr);
      return WriteFile(dir + "/case" + std::to_string(id) + "_" + name + ".bin", h.data(), bytes);
    };
    bool ok = down(q, nq * 2, "q") && down(k, nk * 2, "k") && down(v, nk * 2, "v") && down(dout, nq * 2, "do") &&
              down(out, nq * 4, "out") && down(lse, ns * 4, "lse") && down(dq, nq * 4, "dq") &&
              down(dk, nk * 4, "dk") && down(dv, nk * 4, "dv");
    if (!ok) {
      std::fprintf(stderr, "case %d: write failed\n", id);
      return 1;
    }
    std::fprintf(meta, "%d %s %d %d %lld %lld %d %d %lld %lld %d %.9g\n", id, std::string(DTypeName(s.dtype)).c_str(),
                 s.head_dim, s.batch, static_cast<long long>(s.m), static_cast<long long>(s.n), s.q_heads,
                 s.kv_heads, static_cast<long long>(s.q_row0), static_cast<long long>(s.kv_row0),
                 s.mask == MaskKind::kCausal ? 1 : 0, f.scale);
    for (void* p : {q, k, v, dout}) be.Free(p);
    for (float* p : {out, lse, delta, dq, dk, dv}) be.Free(p);
    ++id;
  }
  std::fclose(meta);
  std::printf("wrote %d cases to %s\n", id, dir.c_str());
  return 0;
}

}  // namespace
}  // namespace dfa

int main(int argc, char** argv) { return dfa::Main(argc, argv); }
