#include "common/grpc_refusal.h"

#include <fcntl.h>
#include <grpcpp/create_channel_posix.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tutti {
namespace {

using ::testing::HasSubstr;

// The refusing side of a connection, as the Unix-socket listener runs it:
// the greeting, then the client's bytes fed until the refusal is finished.
void Refuse(int fd, const absl::Status& why) {
  GrpcRefusal talk(why);
  const std::string hello = talk.Greeting();
  ASSERT_EQ(::write(fd, hello.data(), hello.size()), static_cast<ssize_t>(hello.size()));
  while (!talk.finished() && !talk.failed()) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 30000) <= 0) break;
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    const std::string reply = talk.Feed(absl::string_view(buf, n));
    if (!reply.empty()) {
      ASSERT_EQ(::write(fd, reply.data(), reply.size()), static_cast<ssize_t>(reply.size()));
    }
  }
  EXPECT_TRUE(talk.finished());
  char buf[4096];
  ::fcntl(fd, F_SETFL, O_NONBLOCK);
  while (::read(fd, buf, sizeof(buf)) > 0) {
  }
  ::close(fd);
}

TEST(GrpcRefusal, AGrpcClientsCallFinishesWithTheRefusalsCodeAndMessage) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  const absl::Status why = absl::PermissionDeniedError(
      "uid 1234 (gid 5, groups none, pid 77) may not use this socket: 100% refused, \xc3\xa9");
  std::thread server([&] { Refuse(fds[0], why); });
  auto channel = grpc::CreateInsecureChannelFromFd("refusal", fds[1]);
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::Slice slice(std::string("\x08\x01", 2));
  grpc::ByteBuffer in(&slice, 1), out;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&ctx, "/tutti.v1.Stager/GetStageStatus", grpc::StubOptions(), &in, &out,
                 [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  server.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(status.error_message(), std::string(why.message()));
}

TEST(GrpcRefusal, AnythingButAnHttp2ClientIsDroppedWithoutAReply) {
  GrpcRefusal talk(absl::PermissionDeniedError("no"));
  EXPECT_EQ(talk.Feed("GET / HTTP/1.1\r\n\r\n"), "");
  EXPECT_TRUE(talk.failed());
  GrpcRefusal flood(absl::PermissionDeniedError("no"));
  std::string frames("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
  EXPECT_EQ(flood.Feed(frames), "");
  EXPECT_FALSE(flood.failed());
  // A DATA frame header announcing 16 MiB, then more and more bytes of it.
  EXPECT_EQ(flood.Feed(std::string("\xff\xff\xff\x00\x00\x00\x00\x00\x01", 9)), "");
  for (int i = 0; i < 100 && !flood.failed(); ++i) flood.Feed(std::string(4096, 'x'));
  EXPECT_TRUE(flood.failed());
  EXPECT_FALSE(flood.finished());
}

}  // namespace
}  // namespace tutti
