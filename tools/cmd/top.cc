// spool top: one live screen of every queue under some roots (docs/operations.md).
//
// The queues, their figures and rates come from cli/survey.h, which the dashboard of
// `spool serve --http` shares: a refresh never scans the backlog. ncurses (Debian's libncurses) draws
// the screen: it is on every system with a terminal, and handles the terminal types and
// resizes that hand-written escape codes would get wrong.
#include <curses.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "cli/output.h"
#include "cli/survey.h"
#include "cmd/command.h"

namespace spool::cmd {
namespace {

using Clock = std::chrono::steady_clock;
using cli::human_age;
using cli::human_bytes;
using Row = cli::SurveyedQueue;

struct TopArgs {
  std::vector<std::string> roots;
  std::string interval = "1s";
  int depth = 3;
  bool once = false;
};

// Peek (v): messages read at most per refresh, and of them shown.
constexpr size_t kPeekRead = 200;
constexpr size_t kPeekShown = 40;

enum SortKey { kByName, kByReady, kByInFlight, kByDead, kBySend, kByAck, kByAge, kByDisk, kSortKeys };
const char* kSortNames[kSortKeys] = {"name", "ready", "in flight", "dead", "send/s", "ack/s", "oldest", "disk"};

class Top {
 public:
  Top(const TopArgs& a, Millis interval) : survey_(a.roots, a.depth), interval_(interval) {}

  void discover() { survey_.discover(); }
  void sample() { survey_.sample(); }

  // The rows shown, filtered and sorted.
  std::vector<Row*> shown() const {
    std::vector<Row*> v;
    for (const auto& r : survey_.queues()) {
      if (filter_.empty() || r->name.find(filter_) != std::string::npos) v.push_back(r.get());
    }
    auto key = [&](const Row* r) -> double {
      switch (sort_) {
        case kByReady: return static_cast<double>(r->st.ready);
        case kByInFlight: return static_cast<double>(r->st.in_flight);
        case kByDead: return static_cast<double>(r->st.dead);
        case kBySend: return r->rates.send;
        case kByAck: return r->rates.ack;
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
    std::snprintf(buf, sizeof buf, "%-28s %-6s %9s %9s %8s %8s %9s %9s %8s %8s %9s %10s", "QUEUE", "STATE", "READY",
                  "INFLIGHT", "DELAYED", "DEAD", "SEND/s", "ACK/s", "OLDEST", "DISK", "ROOM", "BRIDGE LAG");
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
    if (r.have_rates) {
      std::snprintf(send, sizeof send, "%.0f", r.rates.send);
      std::snprintf(ack, sizeof ack, "%.0f", r.rates.ack);
    }
    // The tightest of max_ready, max_bytes and the filesystem, as the part of it left.
    const auto [left, what] = r.room.tightest();
    char room[32] = "-";
    if (*what != '\0') std::snprintf(room, sizeof room, "%.0f%% %s", left * 100, what);
    std::snprintf(buf, sizeof buf,
                  "%-28s %-6s %9" PRIu64 " %9" PRIu64 " %8" PRIu64 " %8" PRIu64 " %9s %9s %8s %8s %9s %10s", name.c_str(),
                  s.paused ? "paused" : "run", s.ready, s.in_flight, s.delayed, s.dead, send, ack,
                  human_age(s.oldest_ready_age_s).c_str(), human_bytes(s.bytes_on_disk).c_str(), room,
                  bridge_lag(r.bridges).c_str());
    return buf;
  }

  // The BRIDGE LAG column: "fwd 12" or "pull 3" for one bridge (its lag, "?" before it
  // knows), "2: 15" for two (the sum of the lags known), "-" for none.
  static std::string bridge_lag(const std::vector<cli::BridgeStatus>& bs) {
    if (bs.empty()) return "-";
    int64_t sum = 0;
    bool known = false;
    for (const auto& b : bs) {
      if (b.lag >= 0) sum += b.lag, known = true;
    }
    const std::string lag = known ? std::to_string(sum) : "?";
    if (bs.size() > 1) return std::to_string(bs.size()) + ": " + lag;
    return (bs[0].kind == "forward" ? "fwd " : bs[0].kind + " ") + lag;
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
  // The detail pane's second part: each rate's sparkline, the leases by holder, the dead
  // letters by reason.
  static std::string detail_text(const Row& r);
  // Instead of it with peek on (v): the first kPeekRead messages' payloads, those holding
  // search_, as lines of at most `width` characters. Read again at most once per interval.
  std::string peek_text(const Row& r, size_t width);
  // Edits `text` on the bottom line after `prompt`: Enter keeps the edit, Esc clears it.
  std::string edit_line(const char* prompt, std::string text);
  void act(int key);
  // Asks a yes/no question on the bottom line; true for y.
  bool confirm(const std::string& question);
  Row* selected() {
    auto v = shown();
    if (v.empty()) return nullptr;
    sel_ = std::min<size_t>(sel_, v.size() - 1);
    return v[sel_];
  }

  cli::Survey survey_;
  Millis interval_;
  std::string filter_, note_;
  SortKey sort_ = kByName;
  size_t sel_ = 0, first_ = 0;
  bool detail_ = false, quit_ = false;
  bool peek_ = false;
  std::string search_;  // peek: the text payloads must hold (empty: all)
  // The last peek, of which queue, with which search, when.
  cli::Peeked peeked_;
  std::string peeked_dir_, peeked_search_, peek_error_;
  Clock::time_point peeked_at_;
};

void Top::draw() {
  erase();
  int h = 0, w = 0;
  getmaxyx(stdscr, h, w);
  auto v = shown();
  if (!v.empty()) sel_ = std::min<size_t>(sel_, v.size() - 1);
  attron(A_BOLD);
  mvprintw(0, 0, "spool top: %zu queues%s%s  sort: %s  (q quit, s sort, / %s, enter detail, v peek, p pause, r resume, "
           "d redrive)",
           v.size(), filter_.empty() ? "" : "  filter: ", filter_.c_str(), kSortNames[sort_],
           detail_ && peek_ ? "search payloads" : "filter");
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
    // The rates, leases and dead letters (or the peek) in a column of their own where the
    // screen is wide enough, else below the figures.
    const int col = w >= 120 ? 58 : 0;
    std::string more;
    if (r.q && r.error.empty()) more = peek_ ? peek_text(r, static_cast<size_t>(w - col)) : detail_text(r);
    if (col == 0) text += more;
    std::istringstream in(text);
    std::string first;  // "queue  DIR": the whole width, above the columns
    if (std::getline(in, first) && y < h - 1) mvprintw(y++, 0, "%.*s", w, first.c_str());
    const int top = y;
    for (std::string l; y < h - 1 && std::getline(in, l);) mvprintw(y++, 0, "%.*s", col > 0 ? col - 2 : w, l.c_str());
    if (col > 0) {
      std::istringstream in2(more);
      y = top;
      for (std::string l; y < h - 1 && std::getline(in2, l);) mvprintw(y++, col, "%.*s", w - col, l.c_str());
    }
  }
  if (!note_.empty()) mvprintw(h - 1, 0, "%.*s", w, note_.c_str());
  refresh();
}

std::string Top::detail_text(const Row& r) {
  std::string out;
  char buf[256];
  const size_t width = 40;
  const double unix_now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (const cli::BridgeStatus& b : r.bridges) {
    out += (b.kind == "forward" ? "forward to " : b.kind + " from ") + b.peer + " (pid " + std::to_string(b.pid) + ")\n";
    std::snprintf(buf, sizeof buf, "  moved %" PRIu64 ", lag %s%s%s%s, last %s %" PRIu64 " %s ago\n", b.moved,
                  b.lag >= 0 ? std::to_string(b.lag).c_str() : "?", b.lag_s > 0 ? " (" : "",
                  b.lag_s > 0 ? human_age(b.lag_s).c_str() : "", b.lag_s > 0 ? ")" : "",
                  b.kind == "forward" ? "id" : "seq", b.last_id,
                  b.last_at > 0 ? human_age(std::max(unix_now - b.last_at, 1e-3)).c_str() : "-");
    out += buf;
  }
  auto spark = [&](const char* name, double now, auto pick) {
    std::vector<double> v;
    for (const cli::Sample& x : r.history) v.push_back(pick(x));
    std::snprintf(buf, sizeof buf, "%-8s %6.0f/s |%-*s|\n", name, now, static_cast<int>(width),
                  cli::ascii_sparkline(v, width).c_str());
    out += buf;
  };
  spark("send", r.rates.send, [](const cli::Sample& x) { return x.rates.send; });
  spark("receive", r.rates.receive, [](const cli::Sample& x) { return x.rates.receive; });
  spark("redeliv", r.rates.redeliver, [](const cli::Sample& x) { return x.rates.redeliver; });
  spark("ack", r.rates.ack, [](const cli::Sample& x) { return x.rates.ack; });
  spark("nack", r.rates.nack, [](const cli::Sample& x) { return x.rates.nack; });
  spark("dead", r.rates.dead_lettered, [](const cli::Sample& x) { return x.rates.dead_lettered; });
  std::vector<double> ready;
  for (const cli::Sample& x : r.history) ready.push_back(static_cast<double>(x.ready));
  std::snprintf(buf, sizeof buf, "%-8s %8" PRIu64 " |%-*s|\n", "ready", r.st.ready, static_cast<int>(width),
                cli::ascii_sparkline(ready, width).c_str());
  out += buf;
  const cli::Detail d = cli::read_detail(*r.q, r.st, 1000, 200, 5);
  if (!d.leases.empty()) {
    const auto now = std::chrono::system_clock::now();
    out += "leases by holder (pid, leases, next to end in, last renewed)\n";
    for (const auto& [pid, n] : d.leases_by_holder) {
      double soonest = 1e18;
      for (const MessageInfo& m : d.leases) {
        if (m.holder_pid == pid) soonest = std::min(soonest, std::chrono::duration<double>(m.due - now).count());
      }
      // A bound holder's last receive or extend (Stats::Holder); unbound leases have none.
      std::string renewed;
      for (const Stats::Holder& x : r.st.holders) {
        if (pid != 0 && x.pid == pid && x.renewed_ago_s >= 0) {
          renewed = "  renewed " + human_age(std::max(x.renewed_ago_s, 1e-3)) + " ago";  // (human_age(0) is "-")
        }
      }
      std::snprintf(buf, sizeof buf, "  %-8s %6" PRIu64 "  %s%s%s\n", pid == 0 ? "unbound" : std::to_string(pid).c_str(), n,
                    human_age(soonest).c_str(), renewed.c_str(), d.leases.size() >= 1000 ? " (of the first 1000 leases)" : "");
      out += buf;
    }
  }
  if (d.dead_read > 0) {
    out += "dead letters by reason";
    out += d.dead_read < r.st.dead ? " (of the first " + std::to_string(d.dead_read) + ")\n" : "\n";
    for (const auto& [reason, n] : d.dead_by_reason) {
      std::snprintf(buf, sizeof buf, "  %-14s %6" PRIu64 "\n", reason.c_str(), n);
      out += buf;
    }
    out += "first dead letters (id, reason, deliveries, sent)\n";
    for (const cli::DeadLetter& x : d.dead) {
      std::snprintf(buf, sizeof buf, "  %-6" PRIu64 " %-13s %3s  %s\n", x.id, x.reason.c_str(), x.receive_count.c_str(),
                    x.enqueued_at.c_str());
      out += buf;
    }
  }
  return out;
}

std::string Top::peek_text(const Row& r, size_t width) {
  const auto now = Clock::now();
  if (r.dir != peeked_dir_ || search_ != peeked_search_ || now - peeked_at_ >= interval_) {
    auto p = cli::peek_payloads(*r.q, kPeekRead, search_, kPeekShown);
    peek_error_ = p.ok() ? "" : p.status().message();
    peeked_ = p.ok() ? std::move(*p) : cli::Peeked{};
    peeked_dir_ = r.dir;
    peeked_search_ = search_;
    peeked_at_ = now;
  }
  if (!peek_error_.empty()) return "peek: " + peek_error_ + "\n";
  const cli::Peeked& p = peeked_;
  std::string out = "peek (v closes, / searches payloads): ";
  if (p.read == 0) return out + "the queue holds no message\n";
  // Says how far it looked: a search never reads past the first kPeekRead messages.
  out += (p.more ? "searched the first " : "searched all ") + std::to_string(p.read) + " messages";
  if (!search_.empty()) out += ", " + std::to_string(p.matched) + " hold \"" + search_ + "\"";
  out += "\n";
  char buf[64];
  for (const Message& m : p.shown) {
    std::snprintf(buf, sizeof buf, "  %-8" PRIu64 " %7s  ", m.id, human_bytes(m.payload.size()).c_str());
    out += buf + cli::printable_prefix(m.payload, width > 22 ? width - 22 : 1) + "\n";
  }
  if (p.matched > p.shown.size()) out += "  (" + std::to_string(p.matched - p.shown.size()) + " more)\n";
  return out;
}

std::string Top::edit_line(const char* prompt, std::string text) {
  timeout(-1);
  for (;;) {
    int h = 0, w = 0;
    getmaxyx(stdscr, h, w);
    move(h - 1, 0);
    clrtoeol();
    mvprintw(h - 1, 0, "%s: %.*s", prompt, std::max(1, w - static_cast<int>(std::strlen(prompt)) - 3), text.c_str());
    refresh();
    int c = getch();
    if (c == '\n' || c == KEY_ENTER) break;
    if (c == 27) {
      text.clear();
      break;
    }
    if ((c == KEY_BACKSPACE || c == 127 || c == 8) && !text.empty()) text.pop_back();
    if (c >= 32 && c < 127) text += static_cast<char>(c);
  }
  timeout(static_cast<int>(interval_.count()));
  return text;
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
    case 'v':
      // Peek opens the detail pane; closing the peek leaves the pane open.
      peek_ = !(peek_ && detail_);
      detail_ = true;
      return;
    case '/':
      // With the peek shown: the text payloads must hold; else the filter by name.
      if (detail_ && peek_) {
        search_ = edit_line("search payloads", search_);
        return;
      }
      filter_ = edit_line("filter", filter_);
      sel_ = first_ = 0;
      return;
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
              "      v peek at the first 200 messages' payloads in the detail pane (then / searches them),\n"
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
