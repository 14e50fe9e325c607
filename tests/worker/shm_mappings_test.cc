// Client segments kept mapped by a session (SharedMemoryTransferRequest.keep_mapping): reuse,
// replacement when the name names another object, bounds, and the per-call mapping's errors.
#include "worker/shm_mappings.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

namespace dfa {
namespace {

// A shared-memory object created by the test (as a client would), filled with `fill`.
class Segment {
 public:
  Segment(std::string name, size_t bytes, uint8_t fill) : name_(std::move(name)) {
    shm_unlink(name_.c_str());
    const int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(p, MAP_FAILED);
    std::memset(p, fill, bytes);
    munmap(p, bytes);
    close(fd);
  }
  ~Segment() { shm_unlink(name_.c_str()); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

std::string Name(const char* tag) {
  return "/dfa-shm-mappings-test-" + std::to_string(getpid()) + "-" + tag;
}

TEST(ShmMappingsTest, ReusesTheMappingOfTheSameObject) {
  Segment seg(Name("a"), 1 << 16, 7);
  ShmMappings kept;
  auto m1 = kept.Get(seg.name(), 1 << 12);
  ASSERT_TRUE(m1.ok()) << m1.status();
  EXPECT_EQ((*m1)->len, size_t{1} << 16);  // the whole object, for later larger pieces
  EXPECT_EQ((*m1)->addr[100], 7);
  auto m2 = kept.Get(seg.name(), 1 << 16);
  ASSERT_TRUE(m2.ok()) << m2.status();
  EXPECT_EQ(m1->get(), m2->get());
  EXPECT_EQ(kept.kept(), 1u);
  (*m2)->addr[5] = 9;  // read-write, shared with the client
  auto m3 = MapForCall(seg.name(), 16, /*writable=*/false);
  ASSERT_TRUE(m3.ok()) << m3.status();
  EXPECT_EQ((*m3)->addr[5], 9);
}

TEST(ShmMappingsTest, ANameThatNowNamesAnotherObjectIsMappedAfresh) {
  ShmMappings kept;
  std::shared_ptr<ShmMapping> old;
  {
    Segment seg(Name("b"), 1 << 14, 1);
    auto m = kept.Get(seg.name(), 1 << 14);
    ASSERT_TRUE(m.ok()) << m.status();
    old = *m;
  }  // unlinked: the client made a new segment under the same name next
  Segment seg(Name("b"), 1 << 15, 2);
  auto m = kept.Get(seg.name(), 1 << 15);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_NE(m->get(), old.get());
  EXPECT_EQ((*m)->addr[0], 2);
  EXPECT_EQ(old->addr[0], 1);  // still valid while held
  EXPECT_EQ(kept.kept(), 1u);
}

TEST(ShmMappingsTest, KeepsAtMostKMaxKept) {
  ShmMappings kept;
  std::vector<std::unique_ptr<Segment>> segs;
  for (size_t i = 0; i < ShmMappings::kMaxKept + 2; ++i) {
    segs.push_back(
        std::make_unique<Segment>(Name(std::to_string(i).c_str()), 4096, static_cast<uint8_t>(i)));
    auto m = kept.Get(segs.back()->name(), 4096);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->addr[0], static_cast<uint8_t>(i));
  }
  EXPECT_EQ(kept.kept(), ShmMappings::kMaxKept);
}

TEST(ShmMappingsTest, ErrorsNameTheField) {
  ShmMappings kept;
  auto missing = kept.Get(Name("missing"), 16);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("shm_name"), std::string::npos);
  Segment seg(Name("small"), 4096, 0);
  auto small = kept.Get(seg.name(), 8192);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(small.status().message().find("shm_name"), std::string::npos);
  EXPECT_EQ(MapForCall(seg.name(), 8192, true).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kept.kept(), 0u);
}

}  // namespace
}  // namespace dfa
