#include "sys/sigbus_guard.h"

#include <signal.h>
#include <sys/mman.h>

#include <cstdint>
#include <mutex>

#include "logging.h"

namespace spool::sys {
namespace {

// One registered mapping. `state` says whether the other fields may be read: the handler
// reads a slot only while it is kLive, and registration writes them before publishing it.
// A fixed table of atomics, not a std::map under a mutex: the handler may not lock or
// allocate, and runs on whatever thread touched the page.
enum : int { kFree = 0, kBusy = 1, kLive = 2 };
struct Slot {
  std::atomic<int> state{kFree};
  std::atomic<uintptr_t> addr{0};
  std::atomic<size_t> len{0};
  std::atomic<int> prot{0};
  std::atomic<std::atomic<bool>*> cut{nullptr};
};
Slot g_slots[kMaxGuarded];
struct sigaction g_previous {};
std::once_flag g_installed;

void pass_on(int sig, siginfo_t* info, void* ctx) {
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, ctx);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
    return;
  }
  // As without us: the default action. For a fault, returning re-executes the access,
  // which faults again under SIG_DFL; a SIGBUS sent by kill() is raised again.
  ::signal(SIGBUS, SIG_DFL);
  if (info->si_code <= 0) ::raise(SIGBUS);
}

void on_sigbus(int sig, siginfo_t* info, void* ctx) {
  // A fault, not kill(); and not a misaligned access (BUS_ADRALN, armhf), which zero pages
  // would not cure: the retried access would fault again, forever.
  if (info->si_code > 0 && info->si_code != BUS_ADRALN) {
    const auto a = reinterpret_cast<uintptr_t>(info->si_addr);
    for (Slot& s : g_slots) {
      if (s.state.load(std::memory_order_acquire) != kLive) continue;
      const uintptr_t from = s.addr.load(std::memory_order_relaxed);
      const size_t len = s.len.load(std::memory_order_relaxed);
      if (a < from || a - from >= len) continue;
      // mmap is a plain system call here, safe in a handler in practice (not listed by
      // POSIX as async-signal-safe; nothing else replaces pages at a fixed address).
      void* p = ::mmap(reinterpret_cast<void*>(from), len, s.prot.load(std::memory_order_relaxed),
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      if (p == MAP_FAILED) break;
      if (auto* cut = s.cut.load(std::memory_order_relaxed)) cut->store(true, std::memory_order_release);
      return;
    }
  }
  pass_on(sig, info, ctx);
}

void install() {
  struct sigaction sa {};
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (::sigaction(SIGBUS, &sa, &g_previous) != 0) spool::log().warn("cannot install the SIGBUS guard");
}

}  // namespace

bool guard_mapping(const void* addr, size_t len, int prot, std::atomic<bool>* cut) {
  if (addr == nullptr || len == 0) return false;
  std::call_once(g_installed, install);
  for (Slot& s : g_slots) {
    int expect = kFree;
    if (!s.state.compare_exchange_strong(expect, kBusy, std::memory_order_acquire)) continue;
    s.addr.store(reinterpret_cast<uintptr_t>(addr), std::memory_order_relaxed);
    s.len.store(len, std::memory_order_relaxed);
    s.prot.store(prot, std::memory_order_relaxed);
    s.cut.store(cut, std::memory_order_relaxed);
    s.state.store(kLive, std::memory_order_release);
    return true;
  }
  static std::atomic<bool> told{false};
  if (!told.exchange(true)) {
    spool::log().warn("more than {} mapped queue files in this process; the others are not guarded against "
                      "truncation by another process (SIGBUS)", kMaxGuarded);
  }
  return false;
}

void unguard_mapping(const void* addr) {
  if (addr == nullptr) return;
  const auto a = reinterpret_cast<uintptr_t>(addr);
  for (Slot& s : g_slots) {
    int expect = kLive;
    if (s.addr.load(std::memory_order_relaxed) != a) continue;
    if (!s.state.compare_exchange_strong(expect, kBusy, std::memory_order_acquire)) continue;
    s.addr.store(0, std::memory_order_relaxed);
    s.len.store(0, std::memory_order_relaxed);
    s.cut.store(nullptr, std::memory_order_relaxed);
    s.state.store(kFree, std::memory_order_release);
    return;
  }
}

}  // namespace spool::sys
