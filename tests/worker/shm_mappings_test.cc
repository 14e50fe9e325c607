// A session's shared-memory segments (worker/shm_mappings.h): made by the worker as sealed
// memfds, opened by a client through /proc, shared both ways; the client can neither shrink,
// grow nor unseal them; lookups by name only; at most kMaxSegments; memory reserved in the
// budget while they exist; errors name the field.
#include "worker/shm_mappings.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace dfa {
namespace {

// What a client does with CreateSharedMemoryResponse.path: open and map it read-write.
struct ClientView {
  explicit ClientView(const ShmMappings::Created& c) : bytes(static_cast<size_t>(c.bytes)) {
    fd = open(c.path.c_str(), O_RDWR | O_CLOEXEC);
    EXPECT_GE(fd, 0) << c.path << ": " << std::strerror(errno);
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    EXPECT_NE(p, MAP_FAILED);
    addr = static_cast<uint8_t*>(p);
  }
  ~ClientView() {
    munmap(addr, bytes);
    close(fd);
  }
  int fd = -1;
  uint8_t* addr = nullptr;
  size_t bytes;
};

TEST(ShmMappingsTest, ASegmentIsSharedWithTheClientThroughItsPath) {
  ShmMappings segments;
  auto c = segments.Create(1 << 16, nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bytes, 1 << 16);
  EXPECT_EQ(c->name.rfind("shm-", 0), 0u) << c->name;
  EXPECT_EQ(c->path.rfind("/proc/" + std::to_string(getpid()) + "/fd/", 0), 0u) << c->path;
  ClientView client(*c);
  client.addr[100] = 7;
  auto m = segments.Find(c->name, 1 << 16);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->addr[100], 7);
  (*m)->addr[5] = 9;
  EXPECT_EQ(client.addr[5], 9);
  EXPECT_EQ(segments.kept(), 1u);
}

TEST(ShmMappingsTest, TheClientCannotResizeOrUnsealTheSegment) {
  ShmMappings segments;
  auto c = segments.Create(1 << 14, nullptr);
  ASSERT_TRUE(c.ok()) << c.status();
  ClientView client(*c);
  const int seals = fcntl(client.fd, F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_NE(ftruncate(client.fd, 0), 0) << "a client shrank the worker's segment";
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(client.fd, 1 << 20), 0) << "a client grew the worker's segment";
  EXPECT_NE(fcntl(client.fd, F_ADD_SEALS, F_SEAL_WRITE), 0);
  struct stat sb {};
  ASSERT_EQ(fstat(client.fd, &sb), 0);
  EXPECT_EQ(sb.st_size, 1 << 14);
  auto m = segments.Find(c->name, 1 << 14);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->addr[(1 << 14) - 1], 0);  // every byte still there
}

TEST(ShmMappingsTest, KeepsAtMostKMaxSegmentsAndHeldOnesStayMapped) {
  ShmMappings segments;
  std::vector<ShmMappings::Created> made;
  for (size_t i = 0; i < ShmMappings::kMaxSegments + 2; ++i) {
    auto c = segments.Create(4096, nullptr);
    ASSERT_TRUE(c.ok()) << c.status();
    made.push_back(*c);
  }
  EXPECT_EQ(segments.kept(), ShmMappings::kMaxSegments);
  EXPECT_EQ(segments.Find(made[0].name, 1).status().code(), absl::StatusCode::kNotFound);
  auto newest = segments.Find(made.back().name, 4096);
  ASSERT_TRUE(newest.ok());
  std::shared_ptr<ShmMapping> held = *newest;
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(segments.Create(4096, nullptr).ok());
  held->addr[0] = 1;  // dropped from the set, still mapped while held
  EXPECT_EQ(segments.Find(made.back().name, 1).status().code(), absl::StatusCode::kNotFound);
}

TEST(ShmMappingsTest, SegmentsAreReservedInTheBudget) {
  MemoryBudget budget(3 << 20);
  {
    ShmMappings segments;
    ASSERT_TRUE(segments.Create(1 << 20, &budget).ok());
    ASSERT_TRUE(segments.Create(1 << 20, &budget).ok());
    EXPECT_EQ(budget.used(), 2 << 20);
    auto over = segments.Create(2 << 20, &budget);
    EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
    EXPECT_EQ(budget.used(), 2 << 20);
  }
  EXPECT_EQ(budget.used(), 0);  // released with the session's segments
}

TEST(ShmMappingsTest, ErrorsNameTheField) {
  ShmMappings segments;
  auto missing = segments.Find("/dev/shm/anything-a-client-names", 16);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("shm_name"), std::string::npos);
  auto c = segments.Create(4096, nullptr);
  ASSERT_TRUE(c.ok());
  auto small = segments.Find(c->name, 8192);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(small.status().message().find("shm_name"), std::string::npos);
  for (int64_t bad : {int64_t{0}, int64_t{-1}, ShmMappings::kMaxSegmentBytes + 1}) {
    auto st = segments.Create(bad, nullptr).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("bytes"), std::string::npos) << st;
  }
}

}  // namespace
}  // namespace dfa
