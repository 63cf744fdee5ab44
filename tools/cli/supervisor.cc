#include "cli/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

namespace spool::cli {
namespace {

// Everything below runs in the forked supervisor of a multi-threaded process: system calls
// and plain arithmetic only (no malloc, no stdio, no locks).

constexpr int kStatusFd = 3;  // the supervisor's copy of the status pipe's write end

void pause_ms(long ms) {
  timespec ts{0, ms * 1'000'000};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// "/proc/self/task/<pid>/children" into `buf` (the supervisor has one thread, tid == pid).
void children_path(char* buf, pid_t pid) {
  const char prefix[] = "/proc/self/task/";
  char* p = buf;
  for (const char* s = prefix; *s != '\0'; ++s) *p++ = *s;
  char digits[16];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + pid % 10);
    pid /= 10;
  } while (pid > 0);
  while (n > 0) *p++ = digits[--n];
  const char suffix[] = "/children";
  for (const char* s = suffix; *s != '\0'; ++s) *p++ = *s;
  *p = '\0';
}

// SIGKILLs every living child of the supervisor (orphans re-parented to it included).
void kill_children(const char* path) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // no CONFIG_PROC_CHILDREN: the process-group kill has to do
  char buf[4096];
  ssize_t n;
  pid_t pid = 0;
  bool in_number = false;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) {
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] >= '0' && buf[i] <= '9') {
        pid = pid * 10 + (buf[i] - '0');
        in_number = true;
      } else if (in_number) {
        ::kill(pid, SIGKILL);
        pid = 0;
        in_number = false;
      }
    }
  }
  if (in_number) ::kill(pid, SIGKILL);
  ::close(fd);
}

// SIGKILLs what is left of the command's group and every process below the supervisor,
// and reaps them, until the supervisor has no child left. A process killed in one round
// may leave orphans, re-parented here (child subreaper), for the next.
void sweep(pid_t group, const char* path) {
  ::kill(-group, SIGKILL);
  for (;;) {
    kill_children(path);
    int st;
    pid_t r;
    while ((r = ::waitpid(-1, &st, WNOHANG)) > 0) {
    }
    if (r < 0 && errno == ECHILD) return;
    pause_ms(5);
  }
}

[[noreturn]] void supervise(const char* exe, char* const* argv, char* const* envp, int stdin_fd,
                            int stderr_fd, int status_fd, pid_t parent) {
  // Signals arrive through sigtimedwait only; the command gets an empty mask back.
  sigset_t all, none, wanted;
  ::sigfillset(&all);
  ::sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &all, nullptr);
  ::sigemptyset(&wanted);
  ::sigaddset(&wanted, SIGTERM);
  ::sigaddset(&wanted, SIGUSR1);
  ::sigaddset(&wanted, SIGCHLD);
  // The death of spool work (the thread that forked us) is a SIGUSR1: kill the command.
  ::prctl(PR_SET_PDEATHSIG, SIGUSR1);
  bool kill_all = ::getppid() != parent;  // it died before the prctl
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  // Its own group: a Ctrl-C in the terminal (SIGINT to the foreground group) or a signal to
  // spool work's group does not reach the supervisor, which must outlive spool work.
  ::setpgid(0, 0);

  // Keep 0 (the payload), 1, 2 (the stderr pipe) and the status pipe; close everything
  // else spool work has open (queue files, other commands' pipes: a payload pipe held open
  // here would keep another command from ever seeing the end of its stdin). The pipes are
  // above 2 (spool work's 0-2 are open), so neither dup2 overwrites the other's source,
  // and both are done before the status pipe may take the number 3 from one of them.
  ::dup2(stdin_fd, 0);
  ::dup2(stderr_fd, 2);
  if (status_fd != kStatusFd) ::dup3(status_fd, kStatusFd, O_CLOEXEC);
  if (::close_range(kStatusFd + 1, ~0U, 0) != 0) {
    for (int fd = kStatusFd + 1; fd < 65536; ++fd) ::close(fd);
  }
  char path[64];
  children_path(path, ::getpid());

  pid_t self = ::getpid();
  pid_t cmd = kill_all ? -1 : ::fork();
  if (cmd == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // should the supervisor itself be SIGKILLed
    if (::getppid() != self) ::_exit(127);
    // spool work ignores SIGPIPE; an ignored disposition would survive execve.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    ::sigaction(SIGPIPE, &dfl, nullptr);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::close(kStatusFd);
    ::execve(exe, argv, envp);
    ::_exit(127);
  }
  ::close(0);  // the command holds the payload pipe now; its end must be the only one
  if (cmd < 0) {
    int st = kill_all ? W_EXITCODE(0, SIGKILL) : W_EXITCODE(126, 0);
    if (!kill_all) (void)!::write(kStatusFd, &st, sizeof st);
    ::_exit(0);
  }
  ::setpgid(cmd, cmd);

  int cmd_status = 0;
  bool exited = false;
  while (!exited) {
    if (kill_all) ::kill(-cmd, SIGKILL);
    timespec tick{0, 50'000'000};
    int sig = ::sigtimedwait(&wanted, nullptr, &tick);
    if (sig == SIGTERM) {
      ::kill(-cmd, SIGTERM);
    } else if (sig == SIGUSR1) {
      kill_all = true;
      ::kill(-cmd, SIGKILL);
    }
    // Reap the command and any orphan that has already exited.
    int st;
    pid_t r;
    while ((r = ::waitpid(-1, &st, WNOHANG)) > 0) {
      if (r == cmd) {
        cmd_status = st;
        exited = true;
      }
    }
  }
  sweep(cmd, path);
  (void)!::write(kStatusFd, &cmd_status, sizeof cmd_status);
  ::_exit(0);
}

}  // namespace

Supervised start_supervised(const std::string& exe, char* const* argv, char* const* envp, int stdin_fd,
                            int stderr_fd) {
  Supervised s;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return s;
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) supervise(exe.c_str(), argv, envp, stdin_fd, stderr_fd, fds[1], parent);
  int saved = errno;
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    errno = saved;
    return s;
  }
  ::setpgid(pid, pid);  // also here, so no terminal signal slips in before the child's
  s.pid = pid;
  s.status_fd = fds[0];
  return s;
}

bool supervised_status(Supervised& s, int* wait_status) {
  int st = 0;
  ssize_t n;
  do {
    n = ::read(s.status_fd, &st, sizeof st);
  } while (n < 0 && errno == EINTR);
  ::close(s.status_fd);
  s.status_fd = -1;
  if (n != static_cast<ssize_t>(sizeof st)) return false;
  *wait_status = st;
  return true;
}

}  // namespace spool::cli
