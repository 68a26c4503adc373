#include "common/root_dir.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace tutti {
namespace {

namespace fs = std::filesystem;

std::string ReadFd(int fd) {
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

// root/ holds f ("inside"), d/g ("deep"), links beneath and out of it;
// outside/ holds secret (0600, "secret") and dir/s.
class RootDirTest : public ::testing::TestWithParam<ResolveMode> {
 protected:
  void SetUp() override {
    if (GetParam() == ResolveMode::kOpenat2 && !Openat2Supported()) {
      GTEST_SKIP() << "this kernel has no openat2";
    }
    base_ = ::testing::TempDir() + "/root_dir_" + std::to_string(::getpid()) + "_" +
            ResolveModeName(GetParam());
    fs::remove_all(base_);
    root_ = base_ + "/root";
    outside_ = base_ + "/outside";
    fs::create_directories(root_ + "/d");
    fs::create_directories(outside_ + "/dir");
    std::ofstream(root_ + "/f") << "inside";
    std::ofstream(root_ + "/d/g") << "deep";
    std::ofstream(outside_ + "/secret") << "secret";
    fs::permissions(outside_ + "/secret", fs::perms::owner_read | fs::perms::owner_write);
    std::ofstream(outside_ + "/dir/s") << "outside";
    fs::create_symlink("f", root_ + "/rel");                   // beneath, relative
    fs::create_symlink("../f", root_ + "/d/up");               // beneath, through ..
    fs::create_symlink("d", root_ + "/dlink");                 // a directory beneath
    fs::create_symlink(root_ + "/d/g", root_ + "/abs");        // absolute, beneath the root
    fs::create_symlink(outside_ + "/secret", root_ + "/out");  // absolute, outside
    fs::create_symlink("../outside/secret", root_ + "/up");    // relative, outside
    fs::create_symlink(outside_ + "/dir", root_ + "/outdir");  // a directory outside
    fs::create_symlink("../../outside/dir", root_ + "/d/updir");
    fs::create_symlink("loop2", root_ + "/loop1");
    fs::create_symlink("loop1", root_ + "/loop2");
    auto r = RootDir::Open(root_, GetParam());
    ASSERT_TRUE(r.ok()) << r.status();
    dir_ = std::move(*r);
    EXPECT_EQ(dir_->uses_openat2(), GetParam() == ResolveMode::kOpenat2);
  }
  void TearDown() override { fs::remove_all(base_); }

  std::string Read(const char* name) {
    const int fd = dir_->Open(name, O_RDONLY);
    if (fd < 0) return "errno " + std::to_string(-fd);
    return ReadFd(fd);
  }
  int OpenResult(const char* name, int flags = O_RDONLY, unsigned mode = 0) {
    const int fd = dir_->Open(name, flags, mode);
    if (fd >= 0) ::close(fd);
    return fd >= 0 ? 0 : fd;
  }

  std::string base_, root_, outside_;
  std::unique_ptr<RootDir> dir_;
};

TEST_P(RootDirTest, FilesAndSymlinksThatStayBeneathTheRootOpen) {
  EXPECT_EQ(Read("f"), "inside");
  EXPECT_EQ(Read("d/g"), "deep");
  EXPECT_EQ(Read("./d/../f"), "inside");
  EXPECT_EQ(Read("rel"), "inside");
  EXPECT_EQ(Read("d/up"), "inside");
  EXPECT_EQ(Read("dlink/g"), "deep");
  EXPECT_EQ(Read("abs"), "deep");  // absolute, naming a path under the root
}

TEST_P(RootDirTest, SymlinksOutOfTheRootAreRefused) {
  EXPECT_EQ(OpenResult("out"), -EXDEV);       // a file outside, absolute
  EXPECT_EQ(OpenResult("up"), -EXDEV);        // a file outside, relative
  EXPECT_EQ(OpenResult("outdir/s"), -EXDEV);  // through a directory outside
  EXPECT_EQ(OpenResult("d/updir/s"), -EXDEV);
  EXPECT_EQ(OpenResult("outdir", O_RDONLY | O_DIRECTORY), -EXDEV);
  EXPECT_EQ(OpenResult("loop1"), -ELOOP);
}

TEST_P(RootDirTest, DotDotNeverGoesAboveTheRoot) {
  EXPECT_EQ(OpenResult("../outside/secret"), -EXDEV);
  EXPECT_EQ(OpenResult("d/../../outside/secret"), -EXDEV);
  EXPECT_EQ(OpenResult(".."), -EXDEV);
  EXPECT_EQ(OpenResult((outside_ + "/secret").c_str()), -EXDEV);  // an absolute name
}

TEST_P(RootDirTest, CreatingThroughALinkOutCreatesNothingOutside) {
  EXPECT_EQ(OpenResult("outdir/new", O_WRONLY | O_CREAT, 0640), -EXDEV);
  EXPECT_FALSE(fs::exists(outside_ + "/dir/new"));
  // A symlink where a file is created is not followed.
  EXPECT_EQ(OpenResult("out", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW, 0640), -ELOOP);
  EXPECT_EQ(dir_->MakeDirs("outdir/sub"), -EXDEV);
  EXPECT_FALSE(fs::exists(outside_ + "/dir/sub"));
  EXPECT_EQ(dir_->MakeDirs("new/deeper"), 0);
  EXPECT_TRUE(fs::is_directory(root_ + "/new/deeper"));
  EXPECT_EQ(dir_->Unlink("outdir/s"), -EXDEV);
  EXPECT_TRUE(fs::exists(outside_ + "/dir/s"));
  EXPECT_EQ(dir_->Rename("outdir/s", "outdir/t"), -EXDEV);
  EXPECT_TRUE(fs::exists(outside_ + "/dir/s"));
  // Unlinking a symlink removes the link, never its target.
  EXPECT_EQ(dir_->Unlink("out"), 0);
  EXPECT_TRUE(fs::exists(outside_ + "/secret"));
  std::ofstream(root_ + "/d/a") << "a";
  EXPECT_EQ(dir_->Rename("d/a", "d/b"), 0);
  EXPECT_EQ(Read("d/b"), "a");
  struct stat st;
  EXPECT_EQ(dir_->Stat("dlink/g", &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(dir_->Stat("outdir/s", &st), -EXDEV);
}

TEST_P(RootDirTest, AFileSwappedForASymlinkOutIsRefusedOnTheNextOpen) {
  EXPECT_EQ(Read("d/g"), "deep");
  fs::remove(root_ + "/d/g");
  fs::create_symlink(outside_ + "/secret", root_ + "/d/g");
  EXPECT_EQ(OpenResult("d/g"), -EXDEV);
  fs::remove_all(root_ + "/d");
  fs::create_symlink(outside_ + "/dir", root_ + "/d");
  EXPECT_EQ(OpenResult("d/s"), -EXDEV);
}

INSTANTIATE_TEST_SUITE_P(Modes, RootDirTest,
                         ::testing::Values(ResolveMode::kOpenat2, ResolveMode::kWalk),
                         [](const auto& i) { return std::string(ResolveModeName(i.param)); });

TEST(RootDirProbe, Openat2ProbeAgreesWithTheKernel) {
  open_how how{};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH;
  const long fd = ::syscall(SYS_openat2, AT_FDCWD, ".", &how, sizeof(how));
  const bool works = fd >= 0;
  if (fd >= 0) ::close(static_cast<int>(fd));
  EXPECT_EQ(Openat2Supported(), works) << "errno " << errno;
  auto auto_root = RootDir::Open(".", ResolveMode::kAuto);
  ASSERT_TRUE(auto_root.ok());
  EXPECT_EQ((*auto_root)->uses_openat2(), works);
}

TEST(RootDirProbe, ModesParseAndAMissingRootIsNamed) {
  EXPECT_EQ(*ParseResolveMode("walk"), ResolveMode::kWalk);
  EXPECT_EQ(*ParseResolveMode("openat2"), ResolveMode::kOpenat2);
  EXPECT_EQ(*ParseResolveMode("auto"), ResolveMode::kAuto);
  EXPECT_FALSE(ParseResolveMode("follow").ok());
  auto missing = RootDir::Open("/nonexistent/tutti-root");
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_NE(missing.status().message().find("/nonexistent/tutti-root"), std::string::npos);
}

}  // namespace
}  // namespace tutti
