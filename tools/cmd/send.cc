// spool send: one message from stdin or each argument, or one per line of stdin, in batches
// that fit the queue's back-pressure limits.
#include <cinttypes>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cmd/command.h"

namespace spool::cmd {
namespace {

struct SendArgs {
  std::string dir, delay, wait, dedup_id, batch, priority, group;
  std::vector<std::string> messages, attrs;
  bool lines = false, durable = false, json = false;
  bool dedup_given = false, group_given = false;  // an empty value is refused, not taken as none
};

// One sent message on stdout: its id alone (what scripts capture), or with --json an object
// that also says whether it was a duplicate. A plain duplicate is told on stderr, so that
// `id=$(spool send ...)` gets the id either way.
void print_sent(uint64_t id, bool duplicate, bool json, const std::string& dedup_id) {
  if (json) {
    std::printf("%s\n", nlohmann::json{{"id", id}, {"duplicate", duplicate}}.dump().c_str());
    return;
  }
  std::printf("%" PRIu64 "\n", id);
  if (duplicate) {
    std::fflush(stdout);  // the id first, when both go to one terminal or file
    std::fprintf(stderr, "duplicate: dedup id %s was sent within the queue's dedup window as message %" PRIu64
                         "; nothing was queued\n",
                 dedup_id.c_str(), id);
  }
}

// All of `f`; a read error (stdin is a directory, EIO) is an error, not a short message.
Result<std::string> read_all(FILE* f) {
  std::string s;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  if (std::ferror(f)) return errno_status(errno, "read stdin");
  return s;
}

int run_send(const SendArgs& a) {
  SendOptions so;
  if (!a.delay.empty()) so.delay = duration_arg("--delay", a.delay);
  if (!a.wait.empty()) so.wait_for_room = duration_arg("--wait", a.wait);
  if (a.durable) so.durability = Durability::kSync;
  for (const std::string& kv : a.attrs) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) throw UsageError{"-a takes KEY=VALUE, not '" + kv + "'"};
    if (!so.attributes.emplace(kv.substr(0, eq), kv.substr(eq + 1)).second) {
      throw UsageError{"-a names the attribute '" + kv.substr(0, eq) + "' twice"};
    }
  }
  if (!a.priority.empty()) {
    const uint64_t p = count_arg("--priority", a.priority);
    if (p > 255) throw UsageError{"--priority must be 0 (most urgent) to 255, not " + a.priority};
    so.priority = static_cast<uint8_t>(p);
  }
  // Given empty, they would have been as good as absent (issue 48): a usage error instead.
  if (a.group_given && a.group.empty()) throw UsageError{"--group must be 1 to 128 bytes, not empty"};
  if (a.dedup_given && a.dedup_id.empty()) throw UsageError{"--dedup-id must be 1 to 128 bytes, not empty"};
  if (!a.group.empty()) so.group = a.group;
  uint64_t max_batch = 1000;
  if (!a.batch.empty()) max_batch = count_arg("--batch", a.batch);
  if (max_batch == 0 || max_batch > 100000) throw UsageError{"--batch must be 1 to 100000"};
  Status err;
  auto q = open_existing(a.dir, &err);
  if (!q) return fail(err, a.dir);
  std::vector<std::string> bodies = a.messages;
  if (bodies.empty()) {
    auto read = read_all(stdin);
    if (!read.ok()) return fail(read.status());
    std::string in = std::move(read).value();
    if (!a.lines) {
      bodies.push_back(std::move(in));
    } else {
      size_t start = 0;
      while (start < in.size()) {
        size_t end = in.find('\n', start);
        if (end == std::string::npos) end = in.size();
        bodies.push_back(in.substr(start, end - start));
        start = end + 1;
      }
    }
  } else if (a.lines) {
    throw UsageError{"--lines reads stdin; give either MESSAGE arguments or --lines"};
  }
  auto bad_arg = [](const Status& s) {
    // The library names what is wrong with an attribute or a dedup id.
    if (s.code() == Code::kInvalidArgument) throw UsageError{s.message()};
    return s;
  };
  if (!a.dedup_id.empty()) {
    if (bodies.size() != 1) throw UsageError{"--dedup-id names one message; send exactly one"};
    so.dedup_id = a.dedup_id;
    bool duplicate = false;
    auto id = q->send(bodies.front(), so, &duplicate);
    if (!id.ok()) return fail(bad_arg(id.status()), a.dir);
    print_sent(*id, duplicate, a.json, a.dedup_id);
    return 0;
  }
  // Batches that fit a bounded queue: a batch larger than max_ready (or max_bytes) could
  // never be sent, and one of half of it fits as soon as the queue is half drained.
  const QueueOptions& qo = q->options();
  uint64_t per_batch = max_batch;
  if (qo.max_ready > 0) per_batch = std::min<uint64_t>(per_batch, std::max<uint64_t>(1, qo.max_ready / 2));
  const uint64_t batch_bytes = qo.max_bytes > 0 ? std::max<uint64_t>(1, qo.max_bytes / 2) : UINT64_MAX;
  for (size_t i = 0; i < bodies.size();) {
    std::vector<std::string_view> chunk;
    uint64_t bytes = 0;
    for (; i < bodies.size() && chunk.size() < per_batch; ++i) {
      if (!chunk.empty() && bytes + bodies[i].size() > batch_bytes) break;
      bytes += bodies[i].size();
      chunk.push_back(bodies[i]);
    }
    auto ids = q->send_batch(chunk, so);
    if (!ids.ok()) return fail(bad_arg(ids.status()), a.dir);
    for (uint64_t id : *ids) print_sent(id, false, a.json, "");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

Command add_send(CLI::App& app) {
  auto a = std::make_shared<SendArgs>();
  auto* send = app.add_subcommand("send", "Send messages; prints each id");
  add_dir(send, a->dir);
  send->add_option("MESSAGE", a->messages, "Messages (none: all of stdin is one message)");
  send->add_option("--delay", a->delay, "Deliver no earlier than this from now");
  send->add_flag("--lines", a->lines, "One message per line of stdin (sent in batches)");
  send->add_flag("--durable", a->durable, "Return only once the messages are on disk, whatever the queue's --sync");
  send->add_option("--wait", a->wait, "When the queue is full (--max-ready/--max-bytes), wait up to this long for room (per batch)");
  send->add_option("-a,--attribute", a->attrs, "Attribute KEY=VALUE of every message sent (repeatable)")
      ->allow_extra_args(false);  // one KEY=VALUE per -a: the MESSAGE arguments are not attributes
  send->add_option("--dedup-id", a->dedup_id, "Deduplication id of the one message sent: a second send with it within the "
                                              "queue's --dedup-window queues nothing, prints the first message's id "
                                              "and says 'duplicate: ...' on stderr")
      ->each([a](const std::string&) { a->dedup_given = true; });
  send->add_option("--priority", a->priority, "Priority of every message sent: 0 (most urgent) to 255; default 128. "
                                              "Receive takes the most urgent ready message first");
  send->add_flag("--json", a->json, "One JSON object per message sent: id, duplicate (true: a --dedup-id seen within "
                                    "the window, nothing queued)");
  send->add_option("--group", a->group, "Ordered group of every message sent (1-128 bytes): a group's messages are "
                                        "received one at a time, in send order")
      ->each([a](const std::string&) { a->group_given = true; });
  send->add_option("--batch", a->batch, "Messages per batch (default 1000; at most half the queue's --max-ready/--max-bytes)");
  send->footer("Exit code 1 with 'queue full' when a back-pressure limit is reached (after --wait, if given).\n"
               "Examples: spool send q 'hello'   |   tar c dir | spool send q   |   spool send q --lines < list\n"
               "          spool send q --priority 0 'page the operator'   |   spool send q --group order-17 'paid'");
  Command c{send, [a] { return run_send(*a); }};
  c.reads_stdin = [a] { return a->messages.empty(); };
  return c;
}

}  // namespace spool::cmd
