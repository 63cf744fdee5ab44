// spool top: one live screen of every queue under some roots (docs/operations.md).
//
// Each refresh reads each queue's stats() (counters in the index header, the heap of
// leased and delayed messages, the segment files' sizes): never the backlog, so a queue of
// 10M ready messages costs what one of 10 does. Rates are the counters' differences between
// two refreshes, so sends and acks pay nothing for them. ncurses (Debian's libncurses) draws
// the screen: it is on every system with a terminal, and handles the terminal types and
// resizes that hand-written escape codes would get wrong.
#include <curses.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "cli/output.h"
#include "cmd/command.h"

namespace spool::cmd {
namespace {

using Clock = std::chrono::steady_clock;

struct TopArgs {
  std::vector<std::string> roots;
  std::string interval = "1s";
  int depth = 3;
  bool once = false;
};

// A queue on screen, and what the last two refreshes read of it.
struct Row {
  std::string name;  // as shown: relative to its root
  std::string dir;
  std::unique_ptr<Queue> q;
  std::string error;  // the queue could not be opened or read
  Stats st;
  bool have = false, have_prev = false;
  uint64_t prev_sent = 0, prev_acked = 0;
  Clock::time_point prev_at, at;
  double send_rate = 0, ack_rate = 0;
};

bool is_queue(const std::string& dir) {
  struct stat st {};
  return ::stat((dir + "/spool.conf").c_str(), &st) == 0;
}

// The queues under `dir`, `depth` levels down at most; a queue's own subdirectories (its
// dead-letter queue) are not searched: they show as its dead column.
void find_queues(const std::string& dir, const std::string& name, int depth, std::vector<std::pair<std::string, std::string>>& out) {
  if (is_queue(dir)) {
    out.emplace_back(dir, name);
    return;
  }
  if (depth <= 0) return;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  std::vector<std::string> subs;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == ".." || (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN && e->d_type != DT_LNK)) continue;
    subs.push_back(n);
  }
  ::closedir(d);
  std::sort(subs.begin(), subs.end());
  for (const auto& n : subs) find_queues(dir + "/" + n, name.empty() ? n : name + "/" + n, depth - 1, out);
}

std::string human_bytes(uint64_t b) {
  const char* units = "BKMGTP";
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 5) v /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f%c" : "%.1f%c", v, units[u]);
  return buf;
}

std::string human_age(double s) {
  char buf[32];
  if (s <= 0) return "-";
  if (s < 60) std::snprintf(buf, sizeof buf, "%.1fs", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%.0fm", s / 60);
  else if (s < 86400) std::snprintf(buf, sizeof buf, "%.1fh", s / 3600);
  else std::snprintf(buf, sizeof buf, "%.1fd", s / 86400);
  return buf;
}

enum SortKey { kByName, kByReady, kByInFlight, kByDead, kBySend, kByAck, kByAge, kByDisk, kSortKeys };
const char* kSortNames[kSortKeys] = {"name", "ready", "in flight", "dead", "send/s", "ack/s", "oldest", "disk"};

class Top {
 public:
  Top(const TopArgs& a, Millis interval) : a_(a), interval_(interval) {}

  // Finds the queues under the roots (again: new ones appear, removed ones go).
  void discover() {
    std::vector<std::pair<std::string, std::string>> found;
    for (const auto& root : a_.roots) {
      std::vector<std::pair<std::string, std::string>> here;
      find_queues(root, "", a_.depth, here);
      for (auto& [dir, name] : here) {
        // One root: names relative to it; several: prefixed with the root.
        std::string shown = name.empty() ? root : (a_.roots.size() > 1 ? root + "/" + name : name);
        found.emplace_back(dir, shown);
      }
    }
    std::map<std::string, std::unique_ptr<Row>> old;
    for (auto& r : rows_) old.emplace(r->dir, std::move(r));
    rows_.clear();
    for (auto& [dir, name] : found) {
      auto it = old.find(dir);
      if (it != old.end()) {
        rows_.push_back(std::move(it->second));
        continue;
      }
      auto r = std::make_unique<Row>();
      r->dir = dir;
      r->name = name;
      rows_.push_back(std::move(r));
    }
    discovered_ = Clock::now();
  }

  // Reads every queue's counters.
  void sample() {
    if (Clock::now() - discovered_ > std::chrono::seconds(5)) discover();
    for (auto& r : rows_) {
      if (!r->q) {
        Status err;
        r->q = open_existing(r->dir, &err);
        if (!r->q) {
          r->error = err.message();
          continue;
        }
      }
      auto st = r->q->stats();
      if (!st.ok()) {
        r->error = st.status().message();
        continue;
      }
      r->error.clear();
      const auto now = Clock::now();
      if (r->have) {
        const double secs = std::chrono::duration<double>(now - r->at).count();
        if (secs > 0) {
          r->send_rate = st->sent_total >= r->st.sent_total ? static_cast<double>(st->sent_total - r->st.sent_total) / secs : 0;
          r->ack_rate = st->acked_total >= r->st.acked_total ? static_cast<double>(st->acked_total - r->st.acked_total) / secs : 0;
          r->have_prev = true;
        }
      }
      r->st = *st;
      r->at = now;
      r->have = true;
    }
  }

  // The rows shown, filtered and sorted.
  std::vector<Row*> shown() const {
    std::vector<Row*> v;
    for (const auto& r : rows_) {
      if (filter_.empty() || r->name.find(filter_) != std::string::npos) v.push_back(r.get());
    }
    auto key = [&](const Row* r) -> double {
      switch (sort_) {
        case kByReady: return static_cast<double>(r->st.ready);
        case kByInFlight: return static_cast<double>(r->st.in_flight);
        case kByDead: return static_cast<double>(r->st.dead);
        case kBySend: return r->send_rate;
        case kByAck: return r->ack_rate;
        case kByAge: return r->st.oldest_ready_age_s;
        case kByDisk: return static_cast<double>(r->st.bytes_on_disk);
        default: return 0;
      }
    };
    std::stable_sort(v.begin(), v.end(), [&](const Row* x, const Row* y) {
      if (sort_ == kByName) return x->name < y->name;
      const double kx = key(x), ky = key(y);
      return kx != ky ? kx > ky : x->name < y->name;
    });
    return v;
  }

  static std::string header() {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%-28s %-6s %9s %9s %8s %8s %9s %9s %8s %8s", "QUEUE", "STATE", "READY", "INFLIGHT",
                  "DELAYED", "DEAD", "SEND/s", "ACK/s", "OLDEST", "DISK");
    return buf;
  }

  static std::string line(const Row& r) {
    char buf[512];
    std::string name = r.name.size() > 28 ? "~" + r.name.substr(r.name.size() - 27) : r.name;
    if (!r.error.empty() || !r.have) {
      std::snprintf(buf, sizeof buf, "%-28s %-6s %s", name.c_str(), "error", r.error.c_str());
      return buf;
    }
    const Stats& s = r.st;
    char send[32] = "-", ack[32] = "-";
    if (r.have_prev) {
      std::snprintf(send, sizeof send, "%.0f", r.send_rate);
      std::snprintf(ack, sizeof ack, "%.0f", r.ack_rate);
    }
    std::snprintf(buf, sizeof buf, "%-28s %-6s %9" PRIu64 " %9" PRIu64 " %8" PRIu64 " %8" PRIu64 " %9s %9s %8s %8s",
                  name.c_str(), s.paused ? "paused" : "run", s.ready, s.in_flight, s.delayed, s.dead, send, ack,
                  human_age(s.oldest_ready_age_s).c_str(), human_bytes(s.bytes_on_disk).c_str());
    return buf;
  }

  // --once: the table as text on stdout.
  int print_once() {
    discover();
    sample();
    std::printf("%s\n", header().c_str());
    for (const Row* r : shown()) std::printf("%s\n", line(*r).c_str());
    return stdout_ok() ? 0 : kExitError;
  }

  int run();

 private:
  void draw();
  void act(int key);
  // Asks a yes/no question on the bottom line; true for y.
  bool confirm(const std::string& question);
  Row* selected() {
    auto v = shown();
    if (v.empty()) return nullptr;
    sel_ = std::min<size_t>(sel_, v.size() - 1);
    return v[sel_];
  }

  const TopArgs& a_;
  Millis interval_;
  std::vector<std::unique_ptr<Row>> rows_;
  Clock::time_point discovered_;
  std::string filter_, note_;
  SortKey sort_ = kByName;
  size_t sel_ = 0, first_ = 0;
  bool detail_ = false, quit_ = false;
};

void Top::draw() {
  erase();
  int h = 0, w = 0;
  getmaxyx(stdscr, h, w);
  auto v = shown();
  if (!v.empty()) sel_ = std::min<size_t>(sel_, v.size() - 1);
  attron(A_BOLD);
  mvprintw(0, 0, "spool top: %zu queues%s%s  sort: %s  (q quit, s sort, / filter, enter detail, p pause, r resume, d redrive)",
           v.size(), filter_.empty() ? "" : "  filter: ", filter_.c_str(), kSortNames[sort_]);
  attroff(A_BOLD);
  attron(A_REVERSE);
  mvprintw(1, 0, "%-*s", w, header().c_str());
  attroff(A_REVERSE);
  const int detail_lines = detail_ ? std::min(20, h / 2) : 0;
  const int list_h = std::max(1, h - 3 - detail_lines);
  if (sel_ < first_) first_ = sel_;
  if (sel_ >= first_ + static_cast<size_t>(list_h)) first_ = sel_ - static_cast<size_t>(list_h) + 1;
  for (int i = 0; i < list_h && first_ + static_cast<size_t>(i) < v.size(); ++i) {
    const size_t k = first_ + static_cast<size_t>(i);
    if (k == sel_) attron(A_REVERSE);
    mvprintw(2 + i, 0, "%-*.*s", w, w, line(*v[k]).c_str());
    if (k == sel_) attroff(A_REVERSE);
  }
  if (detail_ && !v.empty()) {
    const Row& r = *v[sel_];
    int y = 2 + list_h;
    mvhline(y++, 0, '-', w);  // (not ACS_HLINE: terminals without line drawing show it as 'q')
    std::string text = r.error.empty() ? cli::human_stats(r.dir, r.st, nullptr, 0) : r.dir + ": " + r.error + "\n";
    char rates[128];
    std::snprintf(rates, sizeof rates, "rates          send %.0f/s, ack %.0f/s\n", r.send_rate, r.ack_rate);
    text += rates;
    std::istringstream in(text);
    for (std::string l; y < h - 1 && std::getline(in, l);) mvprintw(y++, 0, "%.*s", w, l.c_str());
  }
  if (!note_.empty()) mvprintw(h - 1, 0, "%.*s", w, note_.c_str());
  refresh();
}

bool Top::confirm(const std::string& question) {
  int h = 0, w = 0;
  getmaxyx(stdscr, h, w);
  move(h - 1, 0);
  clrtoeol();
  attron(A_BOLD);
  mvprintw(h - 1, 0, "%.*s [y/N] ", w - 8, question.c_str());
  attroff(A_BOLD);
  refresh();
  timeout(-1);
  int c = getch();
  timeout(static_cast<int>(interval_.count()));
  return c == 'y' || c == 'Y';
}

void Top::act(int key) {
  auto count = shown().size();
  switch (key) {
    case 'q':
    case 'Q': quit_ = true; return;
    case KEY_UP:
    case 'k':
      if (sel_ > 0) --sel_;
      return;
    case KEY_DOWN:
    case 'j':
      if (sel_ + 1 < count) ++sel_;
      return;
    case KEY_NPAGE: sel_ = std::min(sel_ + 10, count == 0 ? 0 : count - 1); return;
    case KEY_PPAGE: sel_ = sel_ > 10 ? sel_ - 10 : 0; return;
    case 's': sort_ = static_cast<SortKey>((sort_ + 1) % kSortKeys); return;
    case 'S': sort_ = static_cast<SortKey>((sort_ + kSortKeys - 1) % kSortKeys); return;
    case '\n':
    case KEY_ENTER: detail_ = !detail_; return;
    case '/': {
      // The filter, edited on the bottom line: Enter keeps it, Esc clears it.
      std::string f = filter_;
      timeout(-1);
      for (;;) {
        int h = 0, w = 0;
        getmaxyx(stdscr, h, w);
        move(h - 1, 0);
        clrtoeol();
        mvprintw(h - 1, 0, "filter: %.*s", w - 9, f.c_str());
        refresh();
        int c = getch();
        if (c == '\n' || c == KEY_ENTER) break;
        if (c == 27) {
          f.clear();
          break;
        }
        if ((c == KEY_BACKSPACE || c == 127 || c == 8) && !f.empty()) f.pop_back();
        if (c >= 32 && c < 127) f += static_cast<char>(c);
      }
      timeout(static_cast<int>(interval_.count()));
      filter_ = f;
      sel_ = first_ = 0;
      return;
    }
    default: break;
  }
  Row* r = selected();
  if (r == nullptr || !r->q) return;
  if (key == 'p' || key == 'r') {
    Status s = key == 'p' ? r->q->pause() : r->q->resume();
    note_ = s.ok() ? r->name + (key == 'p' ? " paused" : " resumed") : r->name + ": " + s.message();
    sample();
  } else if (key == 'd') {
    const uint64_t dead = r->st.dead;
    if (dead == 0) {
      note_ = r->name + " has no dead letters";
      return;
    }
    if (!confirm("Redrive the " + std::to_string(dead) + " dead letters of " + r->name + " back into it?")) {
      note_ = "redrive cancelled";
      return;
    }
    auto n = r->q->redrive(SIZE_MAX);
    note_ = n.ok() ? r->name + ": redrove " + std::to_string(*n) + " dead letters" : r->name + ": " + n.status().message();
    sample();
  }
}

int Top::run() {
  if (::isatty(0) == 0 || ::isatty(1) == 0) {
    throw UsageError{"top needs a terminal on stdin and stdout (for a table on stdout: spool top --once)"};
  }
  discover();
  sample();
  if (initscr() == nullptr) {
    std::fprintf(stderr, "spool: top: cannot start the terminal (TERM=%s)\n", std::getenv("TERM") ? std::getenv("TERM") : "");
    return kExitError;
  }
  cbreak();
  noecho();
  keypad(stdscr, TRUE);
  curs_set(0);
  set_escdelay(25);
  timeout(static_cast<int>(interval_.count()));
  auto next = Clock::now() + interval_;
  while (!quit_) {
    draw();
    int c = getch();
    if (c != ERR) {
      if (c != KEY_RESIZE) note_.clear();
      act(c);
    }
    if (Clock::now() >= next) {
      sample();
      next = Clock::now() + interval_;
    }
  }
  endwin();
  return 0;
}

}  // namespace

Command add_top(CLI::App& app) {
  auto a = std::make_shared<TopArgs>();
  auto* top = app.add_subcommand("top", "A live screen of every queue under some directories, with the operator's keys");
  top->add_option("ROOT", a->roots, "A queue, or a directory of queues (searched --depth levels down); "
                                    "default: $SPOOL_ROOTS (colon-separated)");
  top->add_option("--interval", a->interval, "Time between refreshes (default 1s)");
  top->add_option("--depth", a->depth, "How many directory levels under a root to search for queues (default 3)");
  top->add_flag("--once", a->once, "Print the table once on stdout and exit (no terminal needed)");
  top->footer("Keys: up/down (j/k) select, s/S sort key, / filter by name (Enter keeps, Esc clears), Enter detail pane,\n"
              "      p pause, r resume, d redrive dead letters (asks first), q quit.\n"
              "Examples: spool top /var/spool   |   SPOOL_ROOTS=/srv/a:/srv/b spool top   |   spool top q --once");
  Command c{top, [a] {
              if (a->roots.empty()) {
                const char* env = std::getenv("SPOOL_ROOTS");
                std::string s = env != nullptr ? env : "";
                for (size_t at = 0; at <= s.size();) {
                  size_t end = s.find(':', at);
                  if (end == std::string::npos) end = s.size();
                  if (end > at) a->roots.push_back(s.substr(at, end - at));
                  at = end + 1;
                }
              }
              if (a->roots.empty()) throw UsageError{"top: give a ROOT or set SPOOL_ROOTS"};
              for (const auto& root : a->roots) {
                struct stat st {};
                if (::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
                  std::fprintf(stderr, "spool: top: %s is no directory (a root is a queue or a directory of queues)\n",
                               root.c_str());
                  return kExitError;
                }
              }
              if (a->depth < 0 || a->depth > 16) throw UsageError{"--depth must be 0 to 16"};
              const Millis interval = duration_arg("--interval", a->interval);
              if (interval.count() < 50) throw UsageError{"--interval must be at least 50ms"};
              Top t(*a, interval);
              return a->once ? t.print_once() : t.run();
            }};
  c.stdout_data = [a]() -> const char* { return a->once ? "its output" : nullptr; };
  return c;
}

}  // namespace spool::cmd
