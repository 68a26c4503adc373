// tutti-slowfs: a read-only FUSE passthrough that stands in for an NFS mount
// under load. Every lookup, open and read is answered only after a
// configurable latency (many requests wait at once, as on a network file
// system), reads go straight to the daemon (direct I/O: no page cache), and
// chosen files, or byte ranges of them, stall forever (until interrupted or
// unmounted).
//
//   tutti-slowfs SOURCE MOUNTPOINT [--latency_ms=2] [--stall=NAME[@OFFSET+LENGTH]]...
//
// Runs in the foreground until SIGTERM/SIGINT or `fusermount3 -u MOUNTPOINT`.
#define FUSE_USE_VERSION 35
#include <dirent.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

struct Stall {
  std::string name;  // path relative to the source
  bool range = false;
  uint64_t offset = 0, length = 0;
};

struct Config {
  std::string source;
  double latency_ms = 2.0;         // open and read
  double lookup_latency_ms = 0.0;  // lookup
  std::vector<Stall> stalls;
};
Config g_cfg;

// Inode table: inode -> relative path ("" is the root).
std::mutex g_ino_mu;
std::unordered_map<fuse_ino_t, std::string> g_paths;
std::unordered_map<std::string, fuse_ino_t> g_inos;
fuse_ino_t g_next_ino = 2;

std::string PathOf(fuse_ino_t ino) {
  std::lock_guard<std::mutex> l(g_ino_mu);
  auto it = g_paths.find(ino);
  return it == g_paths.end() ? std::string() : it->second;
}
std::string Full(const std::string& rel) { return rel.empty() ? g_cfg.source : g_cfg.source + "/" + rel; }
fuse_ino_t InoFor(const std::string& rel) {
  std::lock_guard<std::mutex> l(g_ino_mu);
  auto it = g_inos.find(rel);
  if (it != g_inos.end()) return it->second;
  const fuse_ino_t ino = g_next_ino++;
  g_inos[rel] = ino;
  g_paths[ino] = rel;
  return ino;
}

// Replies after the latency: a pool of timer threads answers requests in due order.
using Clock = std::chrono::steady_clock;
struct Delayed {
  Clock::time_point due;
  uint64_t seq;
  std::function<void()> reply;
  bool operator>(const Delayed& o) const { return due != o.due ? due > o.due : seq > o.seq; }
};
std::mutex g_q_mu;
std::condition_variable g_q_cv;
std::priority_queue<Delayed, std::vector<Delayed>, std::greater<Delayed>> g_queue;
uint64_t g_seq = 0;
bool g_stop = false;

void Later(std::function<void()> reply, double latency_ms = g_cfg.latency_ms) {
  const auto due = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(latency_ms * 1000));
  {
    std::lock_guard<std::mutex> l(g_q_mu);
    g_queue.push(Delayed{due, g_seq++, std::move(reply)});
  }
  g_q_cv.notify_one();
}

void Replier() {
  std::unique_lock<std::mutex> l(g_q_mu);
  while (!g_stop) {
    if (g_queue.empty()) {
      g_q_cv.wait(l);
      continue;
    }
    const auto due = g_queue.top().due;
    if (Clock::now() < due) {
      g_q_cv.wait_until(l, due);
      continue;
    }
    auto reply = g_queue.top().reply;
    g_queue.pop();
    l.unlock();
    reply();
    l.lock();
  }
}

// Stalled requests: answered with EINTR if the kernel interrupts them, EIO at unmount.
std::mutex g_stall_mu;
std::map<fuse_req_t, bool> g_stalled;

void OnInterrupt(fuse_req_t req, void*) {
  std::lock_guard<std::mutex> l(g_stall_mu);
  if (g_stalled.erase(req)) fuse_reply_err(req, EINTR);
}

bool Stalls(const std::string& rel, uint64_t off, uint64_t len) {
  for (const Stall& s : g_cfg.stalls) {
    if (s.name != rel) continue;
    if (!s.range) return true;
    if (off < s.offset + s.length && s.offset < off + len) return true;
  }
  return false;
}

void StallRequest(fuse_req_t req) {
  {
    std::lock_guard<std::mutex> l(g_stall_mu);
    g_stalled[req] = true;
  }
  fuse_req_interrupt_func(req, OnInterrupt, nullptr);
}

void DoLookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  std::string prel = PathOf(parent);
  std::string rel = prel.empty() ? name : prel + "/" + name;
  Later([req, rel] {
    struct stat st;
    if (::lstat(Full(rel).c_str(), &st) != 0) {
      fuse_reply_err(req, errno);
      return;
    }
    fuse_entry_param e;
    std::memset(&e, 0, sizeof(e));
    e.ino = InoFor(rel);
    st.st_ino = e.ino;
    e.attr = st;
    e.attr_timeout = 1.0;
    e.entry_timeout = 1.0;
    fuse_reply_entry(req, &e);
  }, g_cfg.lookup_latency_ms);
}

void DoGetattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  struct stat st;
  if (::lstat(Full(PathOf(ino)).c_str(), &st) != 0) {
    fuse_reply_err(req, errno);
    return;
  }
  st.st_ino = ino;
  fuse_reply_attr(req, &st, 1.0);
}

void DoOpen(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if ((fi->flags & O_ACCMODE) != O_RDONLY) {
    fuse_reply_err(req, EROFS);
    return;
  }
  const std::string rel = PathOf(ino);
  fuse_file_info copy = *fi;
  Later([req, rel, copy]() mutable {
    int fd = ::open(Full(rel).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      fuse_reply_err(req, errno);
      return;
    }
    copy.fh = static_cast<uint64_t>(fd);
    copy.direct_io = 1;  // every read reaches us (and pays the latency), as on a remote mount
    fuse_reply_open(req, &copy);
  });
}

void DoRead(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  const std::string rel = PathOf(ino);
  if (Stalls(rel, static_cast<uint64_t>(off), size)) return StallRequest(req);
  const int fd = static_cast<int>(fi->fh);
  Later([req, fd, size, off] {
    std::vector<char> buf(size);
    ssize_t n = ::pread(fd, buf.data(), size, off);
    if (n < 0) {
      fuse_reply_err(req, errno);
      return;
    }
    fuse_reply_buf(req, buf.data(), static_cast<size_t>(n));
  });
}

void DoRelease(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  ::close(static_cast<int>(fi->fh));
  fuse_reply_err(req, 0);
}

void DoOpendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  DIR* d = ::opendir(Full(PathOf(ino)).c_str());
  if (d == nullptr) {
    fuse_reply_err(req, errno);
    return;
  }
  fi->fh = reinterpret_cast<uint64_t>(d);
  fuse_reply_open(req, fi);
}

void DoReaddir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  DIR* d = reinterpret_cast<DIR*>(fi->fh);
  ::seekdir(d, off);
  std::vector<char> buf(size);
  size_t used = 0;
  const std::string prel = PathOf(ino);
  while (dirent* e = ::readdir(d)) {
    struct stat st;
    std::memset(&st, 0, sizeof(st));
    st.st_mode = static_cast<mode_t>(e->d_type) << 12;
    const std::string name = e->d_name;
    st.st_ino = (name == "." || name == "..") ? 1 : InoFor(prel.empty() ? name : prel + "/" + name);
    const size_t need = fuse_add_direntry(req, buf.data() + used, size - used, e->d_name, &st, ::telldir(d));
    if (need > size - used) break;
    used += need;
  }
  fuse_reply_buf(req, buf.data(), used);
}

void DoReleasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  ::closedir(reinterpret_cast<DIR*>(fi->fh));
  fuse_reply_err(req, 0);
}

// A remote file system answers lookups in one directory concurrently (NFS
// does); without this capability the kernel serialises them per directory.
void DoInit(void*, fuse_conn_info* conn) {
  if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
  if (conn->capable & FUSE_CAP_ASYNC_READ) conn->want |= FUSE_CAP_ASYNC_READ;
}

bool ParseStall(const std::string& spec, Stall* s) {
  const size_t at = spec.find('@');
  s->name = spec.substr(0, at);
  if (at == std::string::npos) return !s->name.empty();
  const size_t plus = spec.find('+', at);
  if (plus == std::string::npos) return false;
  s->range = true;
  s->offset = std::strtoull(spec.c_str() + at + 1, nullptr, 10);
  s->length = std::strtoull(spec.c_str() + plus + 1, nullptr, 10);
  return s->length > 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: tutti-slowfs SOURCE MOUNTPOINT [--latency_ms=2] [--lookup_latency_ms=0]\n"
          "                    [--stall=NAME[@OFFSET+LENGTH]]...\n"
          "A read-only FUSE passthrough that emulates a remote file system under load:\n"
          "  --latency_ms=X   every open and read is answered X ms later (default 2); any number\n"
          "                   of requests wait at once, as on a network file system\n"
          "  --lookup_latency_ms=X  every name lookup is answered X ms later (default 0; the\n"
          "                   kernel sends one directory's lookups one at a time)\n"
          "  --stall=NAME     reads of NAME (relative to SOURCE) never complete (until interrupted\n"
          "                   or unmounted); NAME@OFFSET+LENGTH stalls only reads touching that range\n"
          "Runs until SIGTERM/SIGINT or 'fusermount3 -u MOUNTPOINT'.\n");
      return 0;
    } else if (a.rfind("--latency_ms=", 0) == 0) {
      g_cfg.latency_ms = std::atof(a.c_str() + 13);
    } else if (a.rfind("--lookup_latency_ms=", 0) == 0) {
      g_cfg.lookup_latency_ms = std::atof(a.c_str() + 20);
    } else if (a.rfind("--stall=", 0) == 0) {
      Stall s;
      if (!ParseStall(a.substr(8), &s)) {
        std::fprintf(stderr, "tutti-slowfs: --stall '%s' is not NAME or NAME@OFFSET+LENGTH\n", a.c_str() + 8);
        return 2;
      }
      g_cfg.stalls.push_back(s);
    } else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "tutti-slowfs: unknown option %s (see --help)\n", a.c_str());
      return 2;
    } else {
      pos.push_back(a);
    }
  }
  if (pos.size() != 2) {
    std::fprintf(stderr, "tutti-slowfs: need SOURCE and MOUNTPOINT (see --help)\n");
    return 2;
  }
  char* real = ::realpath(pos[0].c_str(), nullptr);
  if (real == nullptr) {
    std::fprintf(stderr, "tutti-slowfs: source '%s': %s\n", pos[0].c_str(), std::strerror(errno));
    return 1;
  }
  g_cfg.source = real;
  std::free(real);
  g_paths[FUSE_ROOT_ID] = "";
  g_inos[""] = FUSE_ROOT_ID;

  fuse_lowlevel_ops ops;
  std::memset(&ops, 0, sizeof(ops));
  ops.init = DoInit;
  ops.lookup = DoLookup;
  ops.getattr = DoGetattr;
  ops.open = DoOpen;
  ops.read = DoRead;
  ops.release = DoRelease;
  ops.opendir = DoOpendir;
  ops.readdir = DoReaddir;
  ops.releasedir = DoReleasedir;
  const char* fargv[] = {"tutti-slowfs", "-o", "ro,default_permissions,fsname=tutti-slowfs", nullptr};
  fuse_args args = FUSE_ARGS_INIT(3, const_cast<char**>(fargv));
  fuse_session* se = fuse_session_new(&args, &ops, sizeof(ops), nullptr);
  if (se == nullptr) return 1;
  if (fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, pos[1].c_str()) != 0) {
    std::fprintf(stderr, "tutti-slowfs: cannot mount on %s (is /dev/fuse available?)\n", pos[1].c_str());
    fuse_session_destroy(se);
    return 1;
  }
  std::vector<std::thread> repliers;
  for (int i = 0; i < 4; ++i) repliers.emplace_back(Replier);
  std::printf("tutti-slowfs: %s mounted on %s (latency %.3g ms per open/read, %.3g ms per lookup, "
              "%zu stalls)\n", g_cfg.source.c_str(), pos[1].c_str(), g_cfg.latency_ms,
              g_cfg.lookup_latency_ms, g_cfg.stalls.size());
  std::fflush(stdout);
  fuse_loop_config cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.max_idle_threads = 16;
  const int rc = fuse_session_loop_mt(se, &cfg);
  {
    std::lock_guard<std::mutex> l(g_q_mu);
    g_stop = true;
  }
  g_q_cv.notify_all();
  for (auto& t : repliers) t.join();
  {
    std::lock_guard<std::mutex> l(g_stall_mu);
    for (auto& [req, unused] : g_stalled) fuse_reply_err(req, EIO);
    g_stalled.clear();
  }
  fuse_session_unmount(se);
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);
  return rc < 0 ? 1 : 0;
}
