// The commands on the queue as a whole: mount (runs spoolfs), umount, compact, verify; and
// serve (runs spool-serve).
#include <cinttypes>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "cli/progress.h"
#include "cli/units.h"
#include "cmd/command.h"

namespace spool::cmd {
namespace {

struct AdminArgs {
  std::string dir, mountpoint, log, sub;
  std::vector<std::string> mount_args;
  bool json = false, repair = false, root = false;
};

// Runs the program `exe` that sits beside spool when installed, or in `build_dir` (relative to
// spool's directory) in a build tree, else on PATH, with `args` after its name.
int exec_sibling(const std::string& exe_name, const std::string& build_dir, const std::vector<std::string>& args) {
  char self[4096];
  ssize_t len = ::readlink("/proc/self/exe", self, sizeof self - 1);
  std::string here = len > 0 ? std::string(self, static_cast<size_t>(len)) : "";
  here = here.substr(0, here.find_last_of('/'));
  std::string exe = exe_name;
  for (const std::string& c : {here + "/" + exe_name, here + "/" + build_dir + "/" + exe_name}) {
    if (::access(c.c_str(), X_OK) == 0) {
      exe = c;
      break;
    }
  }
  std::vector<std::string> all = {exe};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv_c;
  for (auto& s : all) argv_c.push_back(s.data());
  argv_c.push_back(nullptr);
  ::execvp(exe.c_str(), argv_c.data());
  std::fprintf(stderr, "spool: cannot run %s (%s); is it installed?\n", exe_name.c_str(), std::strerror(errno));
  return kExitError;
}

int run_mount(const AdminArgs& a) {
  std::vector<std::string> args = {a.dir, a.mountpoint};
  if (a.root) args.push_back("--root");
  if (!a.sub.empty()) args.insert(args.end(), {"--sub", a.sub});
  if (!a.log.empty()) args.insert(args.end(), {"--log", a.log});
  args.insert(args.end(), a.mount_args.begin(), a.mount_args.end());
  return exec_sibling("spoolfs", "../fuse", args);
}

// `spool umount MOUNTPOINT`: fusermount3 -u, which an unprivileged user may run on their
// own mount (umount(8) would need root).
int run_umount(const AdminArgs& a) {
  std::vector<char*> argv_c = {const_cast<char*>("fusermount3"), const_cast<char*>("-u"),
                               const_cast<char*>(a.mountpoint.c_str()), nullptr};
  ::execvp("fusermount3", argv_c.data());
  std::fprintf(stderr, "spool: cannot run fusermount3 (%s); install fuse3, or run umount %s as root\n",
               std::strerror(errno), a.mountpoint.c_str());
  return kExitError;
}

int run_compact(const AdminArgs& a) {
  Status err;
  auto q = open_existing(a.dir, &err);
  if (!q) return fail(err, a.dir);
  cli::ProgressBar bar("compact");
  auto r = q->compact([&](uint64_t done, uint64_t total) { bar.update(done, total); });
  if (!r.ok()) return fail(r.status(), a.dir);
  if (a.json) {
    std::printf("{\"segments_removed\":%" PRIu64 ",\"messages_copied\":%" PRIu64 ",\"bytes_freed\":%" PRIu64 "}\n",
                r->segments_removed, r->messages_copied, r->bytes_freed);
  } else {
    std::printf("removed %" PRIu64 " %s (%s), copied %" PRIu64 " live %s\n", r->segments_removed,
                r->segments_removed == 1 ? "segment" : "segments", cli::format_size(r->bytes_freed).c_str(),
                r->messages_copied, r->messages_copied == 1 ? "message" : "messages");
  }
  return 0;
}

int run_verify(const AdminArgs& a) {
  Status err;
  auto q = open_existing(a.dir, &err);
  if (!q) return fail(err, a.dir);
  cli::ProgressBar bar("verify");
  auto r = q->verify(a.repair, [&](uint64_t done, uint64_t total) { bar.update(done, total); });
  if (!r.ok()) return fail(r.status(), a.dir);
  if (a.json) {
    nlohmann::json j{{"ok", r->ok()}, {"segments", r->segments}, {"records", r->records},
                     {"messages", r->messages}, {"problems", r->problems}, {"repairs", r->repairs}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    for (const auto& p : r->problems) std::printf("problem: %s\n", p.c_str());
    for (const auto& p : r->repairs) std::printf("repaired: %s\n", p.c_str());
    std::printf("%s: %s, %s, %s%s\n", a.dir.c_str(), cli::count_of(r->segments, "segment").c_str(),
                cli::count_of(r->records, "record").c_str(), cli::count_of(r->messages, "message").c_str(),
                r->ok() ? ", ok" : "");
  }
  return r->ok() ? 0 : kExitError;
}

}  // namespace

std::vector<Command> add_admin_commands(CLI::App& app) {
  std::vector<Command> out;
  {
    auto a = std::make_shared<AdminArgs>();
    auto* mount = app.add_subcommand("mount", "Mount the queue as a directory (runs spoolfs)");
    add_dir(mount, a->dir);
    mount->add_option("MOUNTPOINT", a->mountpoint, "Where to mount (an empty directory)")->required();
    mount->add_flag("--root", a->root, "DIR is a directory of queues: each is a subdirectory of the mount");
    mount->add_option("--sub", a->sub, "Mount subscription NAME of the queue: cat receives and rm acks in it only (not with --root)");
    mount->add_option("--log", a->log, "Append spoolfs's errors to FILE (default: syslog)");
    mount->add_option("SPOOLFS_ARGS", a->mount_args, "Further spoolfs options, after --: -o visibility=DUR, --limit N, -f, -d");
    mount->footer("Example: spool mount /var/spool/jobs ~/jobs -- -o visibility=5m\n"
                  "Example: spool mount /var/spool ~/queues --root\n"
                  "Example: spool mount /var/spool/jobs ~/audit --sub audit\n"
                  "Unmount with: spool umount MOUNTPOINT. See docs/filesystem.md.");
    out.push_back({mount, [a] { return run_mount(*a); }});
  }
  {
    auto a = std::make_shared<AdminArgs>();
    auto* umount = app.add_subcommand("umount", "Unmount what spool mount mounted (runs fusermount3 -u)");
    umount->add_option("MOUNTPOINT", a->mountpoint, "The mount point")->required();
    umount->footer("Example: spool umount ~/jobs");
    out.push_back({umount, [a] { return run_umount(*a); }});
  }
  {
    auto a = std::make_shared<AdminArgs>();
    auto* compact = app.add_subcommand("compact", "Reclaim the disk of acked messages now");
    add_dir(compact, a->dir);
    compact->add_flag("--json", a->json, "Print the result as JSON");
    compact->footer("Also runs on its own in the background (docs/compaction.md). Example: spool compact /var/spool/jobs");
    out.push_back({compact, [a] { return run_compact(*a); }});
  }
  {
    auto a = std::make_shared<AdminArgs>();
    auto* verify = app.add_subcommand("verify", "Check segments, index and counters (fsck)");
    add_dir(verify, a->dir);
    verify->add_flag("--repair", a->repair, "Rebuild the index from the log if they disagree");
    verify->add_flag("--json", a->json, "Print the report as JSON");
    verify->footer("Exit code 0 when the queue is sound (after --repair, if given), 1 when problems remain.\n"
                   "Examples: spool verify /var/spool/jobs   |   spool verify /var/spool/jobs --repair --json");
    out.push_back({verify, [a] { return run_verify(*a); }});
  }
  {
    // The HTTP server is its own program, spool-serve (tools/serve/main.cc says why); every
    // argument, --help included, goes to it.
    auto* serve = app.add_subcommand("serve", "Serve queues over HTTP: the SQS API and a dashboard with /metrics (runs spool-serve)");
    serve->prefix_command();
    serve->set_help_flag();
    serve->footer("Examples: spool serve /var/spool --sqs 127.0.0.1:9324 --credentials ~/.aws/credentials\n"
                  "          spool serve /var/spool --http 127.0.0.1:9330 --token-file ~/.spool-token\n"
                  "See docs/sqs.md and docs/operations.md; spool serve --help lists the options.");
    out.push_back({serve, [serve] { return exec_sibling("spool-serve", ".", serve->remaining()); }});
  }
  return out;
}

}  // namespace spool::cmd
