#include "daemon_log.h"

#include <fcntl.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <syslog.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <thread>

#include "logging.h"

namespace spoolfs {

void log_to_stderr() {
  auto logger = std::make_shared<spdlog::logger>("spoolfs", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  logger->set_pattern(spool::kLogPattern);  // the library's one format (src/logging.h)
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(std::move(logger));
}

int open_log_file(const std::string& path) {
  return ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0600);
}

namespace {

// Reads lines from `fd` until every writer is gone (the process exits) and logs each.
void forward_to_syslog(int fd) {
  std::string pending;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    for (size_t nl; (nl = pending.find('\n')) != std::string::npos; pending.erase(0, nl + 1)) {
      if (nl > 0) ::syslog(LOG_WARNING, "%.*s", static_cast<int>(nl), pending.data());
    }
    // A line longer than the buffer still goes out, in pieces.
    if (pending.size() > sizeof buf) {
      ::syslog(LOG_WARNING, "%s", pending.c_str());
      pending.clear();
    }
  }
  if (!pending.empty()) ::syslog(LOG_WARNING, "%s", pending.c_str());
  ::close(fd);
}

}  // namespace

bool redirect_stderr(int log_fd) {
  if (log_fd >= 0) {
    bool ok = ::dup2(log_fd, STDERR_FILENO) >= 0;
    ::close(log_fd);
    return ok;
  }
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return false;
  ::openlog("spoolfs", LOG_PID, LOG_DAEMON);
  if (::dup2(p[1], STDERR_FILENO) < 0) {
    ::close(p[0]);
    ::close(p[1]);
    return false;
  }
  ::close(p[1]);
  // Detached: it ends with the process (lines written in its last moment may be lost).
  std::thread(forward_to_syslog, p[0]).detach();
  return true;
}

}  // namespace spoolfs
