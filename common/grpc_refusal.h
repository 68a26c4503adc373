// The answer of a daemon to a connection it will not serve (a Unix-socket
// peer whose credentials are refused, peer_credentials.h): instead of a
// bare close, which a gRPC client reports as UNAVAILABLE and retries, every
// call the client starts on the connection finishes at once with the
// refusal's status and message (a gRPC "trailers-only" response), and the
// connection is then closed (GOAWAY). The client sees, e.g.,
// PERMISSION_DENIED "uid 1234 (...) may not use this socket: ...".
//
// Only as much HTTP/2 as that takes: the server's SETTINGS, SETTINGS ACK,
// a HEADERS frame ending each stream the client opened, GOAWAY. The
// client's frames are delimited by their headers and never decoded (no
// HPACK state is kept); anything that is not an HTTP/2 client's preface
// ends the exchange.
//
// Not thread-safe: one connection's bytes, in order, on one thread.
#ifndef TUTTI_COMMON_GRPC_REFUSAL_H_
#define TUTTI_COMMON_GRPC_REFUSAL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tutti {

class GrpcRefusal {
 public:
  // `status` is not OK; its code and message are what every call gets.
  explicit GrpcRefusal(const absl::Status& status);

  // What to write as soon as the connection is accepted (the server's
  // connection preface).
  std::string Greeting() const;
  // Takes bytes the client sent and returns what to write in reply. Once
  // finished() the reply ends with GOAWAY and the connection is to be
  // closed; once failed() the client spoke something else (or more than a
  // refusal reads) and the connection is to be closed without a reply.
  std::string Feed(absl::string_view bytes);
  bool finished() const { return finished_; }
  bool failed() const { return failed_; }

 private:
  std::string Answer(uint32_t stream) const;

  const std::string code_;     // "7"
  const std::string message_;  // percent-encoded
  std::string pending_;        // bytes not yet a whole frame
  bool preface_seen_ = false;
  bool finished_ = false;
  bool failed_ = false;
  uint64_t received_ = 0;
};

}  // namespace tutti

#endif  // TUTTI_COMMON_GRPC_REFUSAL_H_
