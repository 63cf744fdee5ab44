// spool init: creates a queue with its stored settings.
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "cmd/command.h"

namespace spool::cmd {
namespace {

struct InitArgs {
  std::string dir, visibility, sync = "interval", segment_size, max_payload, retention_age, retention_bytes,
      max_ready, max_bytes, dedup_window, keep_acked, mode, group;
  uint32_t max_receives = 10;
};

// A group by name or number (as chgrp takes it).
int64_t group_arg(const std::string& text) {
  if (!text.empty() && text.size() <= 9 && text.find_first_not_of("0123456789") == std::string::npos) {
    return static_cast<int64_t>(std::stoul(text));
  }
  struct group gr {};
  struct group* found = nullptr;
  std::vector<char> buf(16384);
  if (::getgrnam_r(text.c_str(), &gr, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    throw UsageError{"--group " + text + ": no such group"};
  }
  return static_cast<int64_t>(found->gr_gid);
}

int run_init(const InitArgs& a) {
  QueueOptions o;
  if (!a.visibility.empty()) o.visibility = duration_arg("--visibility", a.visibility);
  if (o.visibility.count() <= 0) throw UsageError{"--visibility must be more than 0"};
  o.max_receives = a.max_receives;
  o.sync = a.sync == "always" ? SyncPolicy::kAlways : a.sync == "never" ? SyncPolicy::kNever : SyncPolicy::kInterval;
  if (!a.segment_size.empty()) o.segment_size = size_arg("--segment-size", a.segment_size);
  if (!a.max_payload.empty()) o.max_payload = size_arg("--max-payload", a.max_payload);
  if (!a.retention_age.empty()) o.retention_max_age = duration_arg("--retention-max-age", a.retention_age);
  if (!a.retention_bytes.empty()) o.retention_max_bytes = size_arg("--retention-max-bytes", a.retention_bytes);
  if (!a.max_ready.empty()) o.max_ready = count_arg("--max-ready", a.max_ready);
  if (!a.max_bytes.empty()) o.max_bytes = size_arg("--max-bytes", a.max_bytes);
  if (!a.dedup_window.empty()) o.dedup_window = duration_arg("--dedup-window", a.dedup_window);
  if (!a.keep_acked.empty()) o.keep_acked = duration_arg("--keep-acked", a.keep_acked);
  if (!a.mode.empty()) {
    const bool octal = a.mode.size() <= 4 && a.mode.find_first_not_of("01234567") == std::string::npos;
    o.mode = octal ? static_cast<uint32_t>(std::stoul(a.mode, nullptr, 8)) : 01000;
    if (!octal || o.mode == 0) throw UsageError{"--mode " + a.mode + ": an octal file mode such as 0660 or 0640"};
  }
  if (!a.group.empty()) o.group = group_arg(a.group);
  // Private by default (docs/security.md, "Who may do what"): a queue's payloads are its
  // owner's unless asked otherwise, as ~/.ssh or a database's data directory, whatever the
  // umask. Asked otherwise: --mode, --group, or a directory that already lets its group
  // write (a shared area an administrator set up: the files then follow its mode).
  if (a.mode.empty() && a.group.empty()) {
    struct stat st {};
    const bool group_dir = ::stat(a.dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && (st.st_mode & S_IWGRP) != 0;
    if (!group_dir) o.mode = 0600;
  }
  QueueOptions probe;
  probe.create = false;
  if (Queue::open(a.dir, probe).ok()) {
    std::fprintf(stderr, "spool: %s is already a queue (its settings were fixed when it was created)\n", a.dir.c_str());
    return kExitError;
  }
  // A refused init leaves nothing behind: not the directory (later commands would call
  // it "not a spool queue"), nor the files the open made in an empty one.
  struct stat before {};
  const bool existed = ::stat(a.dir.c_str(), &before) == 0;
  std::vector<std::string> made;
  for (const char* f : {"gate", "lock"}) {
    if (::access((a.dir + "/" + f).c_str(), F_OK) != 0) made.push_back(a.dir + "/" + f);
  }
  auto q = Queue::open(a.dir, o);
  if (!q.ok()) {
    for (const auto& f : made) ::unlink(f.c_str());
    if (!existed) ::rmdir(a.dir.c_str());
    // The library rejects out-of-range settings (segment size, max payload) this way.
    if (q.status().code() == Code::kInvalidArgument) throw UsageError{q.status().message()};
    return fail(q.status(), "");
  }
  return 0;
}

}  // namespace

Command add_init(CLI::App& app) {
  auto a = std::make_shared<InitArgs>();
  auto* init = app.add_subcommand("init", "Create a queue in DIR (settings are fixed at creation)");
  add_dir(init, a->dir);
  init->add_option("--visibility", a->visibility, "Default lease length of recv (default 30s)");
  init->add_option("--max-receives", a->max_receives, "Deliveries before dead-lettering; 0: never (default 10)");
  init->add_option("--sync", a->sync, "Durability: always, interval (default) or never")
      ->check(CLI::IsMember({"always", "interval", "never"}));
  init->add_option("--segment-size", a->segment_size, "Largest segment file: the first is 256K, each next one twice the last, up to this (default 64M)");
  init->add_option("--max-payload", a->max_payload, "Largest message (default 1M)");
  init->add_option("--retention-max-age", a->retention_age, "Drop ready messages older than this (default off)");
  init->add_option("--retention-max-bytes", a->retention_bytes, "Drop the oldest ready messages above this much payload (default off)");
  init->add_option("--max-ready", a->max_ready, "Back-pressure: refuse sends beyond N messages waiting (default off)");
  init->add_option("--max-bytes", a->max_bytes, "Back-pressure: refuse sends beyond this much payload queued (default off)");
  init->add_option("--dedup-window", a->dedup_window, "How long a send's --dedup-id is remembered (default 5m, at most 7d)");
  init->add_option("--keep-acked", a->keep_acked, "Keep acked messages in the log this long, for spool replay (default off; at most 720h, 30 days)");
  init->add_option("--mode", a->mode, "Octal mode of the queue's files, e.g. 0660 for a queue a group shares, 0644 to let others read (default 0600, or the directory's if it lets its group write)");
  init->add_option("--group", a->group, "Group (name or number) that owns the queue; every file made later, by anyone, takes it");
  init->footer("Example: spool init /var/spool/jobs --visibility 5m --sync always --max-ready 100000\n"
               "Replayable for a day after each ack: spool init /var/spool/jobs --keep-acked 24h\n"
               "Shared by a group: spool init /srv/q --group workers --mode 0660");
  return {init, [a] { return run_init(*a); }};
}

}  // namespace spool::cmd
