#include "cmd/command.h"

#include <cinttypes>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <map>

#include "cli/output.h"
#include "cli/units.h"

namespace spool::cmd {

void add_dir(CLI::App* sub, std::string& dir) { sub->add_option("DIR", dir, "Queue directory")->required(); }

void add_subscription_flag(CLI::App* sub, std::string& name) {
  sub->add_option("--sub", name, "Read subscription NAME of the queue (spool sub list shows them)");
}

void name_flag_values(CLI::App& app) {
  // By flag name: the same name takes the same kind of value in every command.
  static const std::map<std::string, std::string> kKinds = {
      {"ack-timeout", "DUR"}, {"ack-wait", "DUR"}, {"dedup-window", "DUR"}, {"delay", "DUR"},
      {"give-up", "DUR"}, {"grace", "DUR"}, {"interval", "DUR"}, {"keep-acked", "DUR"},
      {"latency", "DUR"}, {"max-runtime", "DUR"}, {"retention-max-age", "DUR"}, {"since", "DUR"},
      {"sync-interval", "DUR"}, {"target", "DUR"}, {"until", "DUR"}, {"visibility", "DUR"},
      {"wait", "DUR"},
      {"max-bytes", "SIZE"}, {"max-payload", "SIZE"}, {"retention-max-bytes", "SIZE"}, {"segment-size", "SIZE"},
      {"batch", "N"}, {"depth", "N"}, {"j", "N"}, {"max", "N"}, {"max-messages", "N"}, {"max-ready", "N"},
      {"max-receives", "N"}, {"n", "N"}, {"priority", "N"}, {"rate", "N"},
      {"id", "ID"}, {"after", "ID"}, {"attribute", "KEY=VALUE"}, {"mode", "MODE"}, {"group", "GROUP"}, {"dedup-id", "ID"},
      {"log", "FILE"}, {"to", "DIR"}, {"nats", "URL"}, {"stream", "NAME"}, {"sub", "NAME"}};
  for (auto* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    for (auto* opt : sub->get_options([](CLI::Option* o) { return o->get_items_expected_max() > 0; })) {
      std::string name = opt->get_single_name();
      auto it = kKinds.find(name);
      if (it != kKinds.end()) opt->type_name(it->second);
    }
  }
}

Millis duration_arg(const std::string& flag, const std::string& text) {
  auto d = cli::parse_duration(text);
  if (!d) throw UsageError{"bad duration '" + text + "' for " + flag + " (use 500ms, 30s, 5m, 2h or seconds)"};
  return *d;
}

uint64_t size_arg(const std::string& flag, const std::string& text) {
  auto s = cli::parse_size(text);
  if (!s) throw UsageError{"bad size '" + text + "' for " + flag + " (use 4096, 64K, 64M or 1G)"};
  return *s;
}

// A K or M suffix on a count would mean 1024s, which no one expects: digits only.
uint64_t count_arg(const std::string& flag, const std::string& text) {
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos) {
    throw UsageError{"bad count '" + text + "' for " + flag + " (a whole number, such as 100000)"};
  }
  return std::stoull(text);
}

namespace {

// What a value of this kind looks like (the type names name_flag_values() gives).
std::string kind_of(const CLI::Option* o) {
  const std::string t = o->get_type_name();
  if (t == "DUR") return "a duration: 500ms, 30s, 5m, 2h or seconds";
  if (t == "SIZE") return "a size: 4096, 64K, 64M or 1G";
  if (t == "N") return "a whole number";
  if (t.empty()) return "a value";
  return t;
}

// CLI11's sentences start with a capital ("Value 0 not in range"); spool's clauses do not.
// An acronym or a flag stays as it is.
std::string lower_first(std::string s) {
  if (s.size() > 1 && s[0] >= 'A' && s[0] <= 'Z' && s[1] >= 'a' && s[1] <= 'z') s[0] = static_cast<char>(s[0] - 'A' + 'a');
  return s;
}

}  // namespace

std::string parse_failure(const CLI::App* app, const CLI::Error& e) {
  // The command being parsed: the deepest subcommand met so far.
  const CLI::App* at = app;
  std::string cmd = "spool";
  for (auto subs = at->get_subcommands(); !subs.empty(); subs = at->get_subcommands()) {
    at = subs.back();
    cmd += " " + at->get_name();
  }
  const std::string what = e.what();
  // The flag or argument an error is about: CLI11 starts its messages with its name.
  auto named = [&](const std::string& prefix) -> const CLI::Option* {
    for (const CLI::Option* o : at->get_options()) {
      const std::string n = o->get_name();
      if (!n.empty() && what.starts_with(prefix + n) &&
          (what.size() == prefix.size() + n.size() || what[prefix.size() + n.size()] == ':' ||
           what[prefix.size() + n.size()] == ' ')) {
        return o;
      }
    }
    return nullptr;
  };
  // Told apart by class (an ExtrasError's get_name() is the command's name, not its class's).
  std::string msg;
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    std::vector<std::string> extra = app->remaining(true);
    if (extra.empty()) {
      msg = what;
    } else if (extra.front().starts_with("-")) {
      msg = "unknown flag '" + extra.front() + "'";
    } else {
      msg = "unexpected argument" + std::string(extra.size() > 1 ? "s" : "");
      for (const auto& x : extra) msg += " '" + x + "'";
    }
  } else if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
    for (const CLI::Option* o : at->get_options()) {
      if (o->get_required() && o->count() == 0) {
        msg = "missing " + o->get_name() + (o->get_positional() ? "" : " " + o->get_type_name());
        break;
      }
    }
    if (msg.empty()) msg = at == app ? "a command is required" : "missing a subcommand";
  } else if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
    const CLI::Option* o = named("");
    if (o == nullptr) {
      msg = what;
    } else if (what.find("missing") != std::string::npos || what.find("least") != std::string::npos) {
      msg = o->get_name() + " needs a value (" + kind_of(o) + ")";
    } else {
      msg = o->get_name() + " takes one value, more were given";
    }
  } else if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr) {
    const std::string lead = "Could not convert: ";
    const CLI::Option* o = named(lead);
    if (o != nullptr) {
      const size_t eq = lead.size() + o->get_name().size() + 3;  // " = "
      msg = "bad value '" + (eq <= what.size() ? what.substr(eq) : "") + "' for " + o->get_name() + " (" +
            kind_of(o) + ")";
    } else {
      msg = what;
    }
  } else if (dynamic_cast<const CLI::ValidationError*>(&e) != nullptr) {
    const CLI::Option* o = named("");
    if (o != nullptr) {
      const std::string given = o->results().empty() ? "" : o->results().front();
      const std::string why = what.substr(std::min(what.size(), o->get_name().size() + 2));
      msg = "bad value '" + given + "' for " + o->get_name() + " (" + lower_first(why) + ")";
    } else {
      msg = what;
    }
  } else {
    msg = what;
  }
  const std::string fix = at == app ? "run 'spool help' for the commands" : "run '" + cmd + " --help' for its usage";
  return cmd + ": " + lower_first(msg) + "; " + fix + "\n";
}

namespace {

// What to suggest for a path that is not a queue: `spool init` only works on a new or empty
// directory (one holding just what a failed open leaves behind: gate, lock).
std::string init_hint(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return "; create it with: spool init " + dir;
  if (!S_ISDIR(st.st_mode)) return "; it is a file: spool init needs a new or empty directory";
  bool foreign = false;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != ".." && name != "gate" && name != "lock") foreign = true;
    }
    ::closedir(d);
  }
  if (foreign) return "; it holds other files: spool init needs a new or empty directory";
  return "; create it with: spool init " + dir;
}

}  // namespace

int fail(const Status& s, const std::string& dir) {
  std::string msg = s.message();
  if (s.code() == Code::kNotAQueue && !dir.empty()) msg += init_hint(dir);
  if (s.code() == Code::kLeaseLost) {
    std::fprintf(stderr, "spool: %s\n", msg.c_str());
    return kExitLeaseLost;
  }
  if (s.code() == Code::kEmpty) {
    std::fprintf(stderr, "spool: %s\n", msg.c_str());
    return kExitEmpty;
  }
  // Freeing disk helps a full file system, not a log that has used every segment number
  // (whose message says what does), nor a message that says already what to do.
  if (s.code() == Code::kNoSpace && msg.find("every segment number") == std::string::npos &&
      msg.find("then retry") == std::string::npos) {
    msg += " (free disk space, then retry)";
  }
  std::fprintf(stderr, "spool: %s\n", msg.c_str());
  return s.code() == Code::kQueueFull ? kExitTryLater : kExitError;
}

std::unique_ptr<Queue> open_existing(const std::string& dir, Status* err, const std::string& subscription) {
  QueueOptions o;
  o.create = false;
  o.subscription = subscription;
  auto q = Queue::open(dir, o);
  if (!q.ok()) {
    *err = q.status();
    return nullptr;
  }
  return std::move(q).value();
}

bool stdout_ok() {
  static int first_errno = 0;
  if (std::fflush(stdout) != 0 && first_errno == 0) first_errno = errno != 0 ? errno : EIO;
  if (std::ferror(stdout) && first_errno == 0) first_errno = EIO;
  errno = first_errno;
  return first_errno == 0;
}

// The id a dead letter had in its queue (its spool.dead.original_id attribute), 0 if none
// (as MessageInfo::original_id, which list() gives; peek gives attributes).
static uint64_t original_id(const Message& m) {
  auto a = m.attributes.find("spool.dead.original_id");
  if (a == m.attributes.end()) return 0;
  uint64_t id = 0;
  auto [end, ec] = std::from_chars(a->second.data(), a->second.data() + a->second.size(), id);
  return ec == std::errc{} && end == a->second.data() + a->second.size() ? id : 0;
}

void print_messages(const std::vector<Message>& msgs, bool json, bool receipts, bool dead_letters) {
  for (const auto& m : msgs) {
    const uint64_t was = dead_letters ? original_id(m) : 0;
    if (json) {
      auto j = cli::message_json(m);
      if (was != 0) j["original_id"] = was;
      std::printf("%s\n", j.dump().c_str());
    } else if (receipts) {
      std::fwrite(m.payload.data(), 1, m.payload.size(), stdout);
      // On a terminal the receipt that follows on stderr starts a line of its own: a payload
      // without a final newline ran into it ("helloreceipt: ..."). Only there: into a pipe
      // or a file the payload goes byte for byte.
      if (::isatty(1) && ::isatty(2) && (m.payload.empty() || m.payload.back() != '\n')) std::fputc('\n', stdout);
      // No receipt for a payload that did not get through (recv then returns it and fails).
      if (!stdout_ok()) return;
      std::fprintf(stderr, "receipt: %s\n", m.receipt.c_str());
      for (const auto& [k, v] : m.attributes) {
        std::fprintf(stderr, "attribute: %s=%s\n", cli::one_line(k).c_str(), cli::one_line(v).c_str());
      }
    } else {
      const std::string of = was == 0 ? "" : "dead letter of message " + std::to_string(was) + ", ";
      std::printf("--- message %" PRIu64 " (%sreceived %s, enqueued %s, %s)\n", m.id, of.c_str(),
                  cli::count_of(m.receive_count, "time").c_str(), cli::iso_time(m.enqueued).c_str(),
                  cli::count_of(m.payload.size(), "byte").c_str());
      for (const auto& [k, v] : m.attributes) {
        std::printf("attribute: %s=%s\n", cli::one_line(k).c_str(), cli::one_line(v).c_str());
      }
      std::fwrite(m.payload.data(), 1, m.payload.size(), stdout);
      std::printf("\n");
    }
  }
}

}  // namespace spool::cmd
