// The commands on single messages: recv, ack, nack, extend, peek, list, show, purge, delete.
#include <cinttypes>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cli/output.h"
#include "cmd/command.h"

namespace spool::cmd {
namespace {

struct MessageArgs {
  std::string dir, receipt, visibility, wait, delay, dur, after, sub;
  std::vector<std::string> receipts, states, ids;
  size_t n = 1;
  std::string id;  // show's ID, checked as delete's are (CLI11 read "-1" as 18446744073709551615)
  bool json = false, durable = false, yes = false, dlq = false;
};

// `q`, or its dead-letter queue for the --dlq of show and delete.
Result<Queue*> queue_or_dead_letters(Queue& q, bool dlq) {
  if (!dlq) return &q;
  return q.dead_letters();
}

int run_recv(const MessageArgs& a) {
  Millis vis = a.visibility.empty() ? Millis(0) : duration_arg("--visibility", a.visibility);
  Millis w = a.wait.empty() ? Millis(0) : duration_arg("--wait", a.wait);
  Status err;
  auto q = open_existing(a.dir, &err, a.sub);
  if (!q) return fail(err, a.dir);
  auto msgs = q->receive(a.n, vis, w);
  if (!msgs.ok()) return fail(msgs.status(), a.dir);
  print_messages(*msgs, a.json, true);
  if (!stdout_ok()) {
    // The payload did not reach its destination: give the messages back at once rather
    // than exit 0 and let a script ack what it never got.
    int write_errno = errno;
    for (const auto& m : *msgs) (void)q->nack(m.receipt);
    std::fprintf(stderr, "spool: writing the payload failed: %s; the message was returned to the queue\n",
                 std::strerror(write_errno));
    return kExitError;
  }
  return 0;
}

int run_ack(const MessageArgs& a) {
  Status err;
  auto q = open_existing(a.dir, &err, a.sub);
  if (!q) return fail(err, a.dir);
  // Every receipt in one call: one append, one sync, one ACK record per delivery number.
  const std::vector<std::string_view> receipts(a.receipts.begin(), a.receipts.end());
  auto acked = q->ack_batch(receipts, a.durable ? Durability::kSync : Durability::kQueuePolicy);
  if (!acked.ok()) return fail(acked.status(), a.dir);
  int rc = 0;
  for (const Status& s : *acked) {
    if (!s.ok()) {
      int code = fail(s, a.dir);
      if (rc == 0 || code == kExitLeaseLost) rc = code;
    }
  }
  return rc;
}

int run_nack(const MessageArgs& a) {
  Millis d = a.delay.empty() ? Millis(0) : duration_arg("--delay", a.delay);
  Status err;
  auto q = open_existing(a.dir, &err, a.sub);
  if (!q) return fail(err, a.dir);
  Status s = q->nack(a.receipt, d);
  return s.ok() ? 0 : fail(s, a.dir);
}

int run_extend(const MessageArgs& a) {
  Millis d = duration_arg("DUR", a.dur);
  if (d.count() <= 0) throw UsageError{"DUR must be more than 0"};
  Status err;
  auto q = open_existing(a.dir, &err, a.sub);
  if (!q) return fail(err, a.dir);
  Status s = q->extend(a.receipt, d);
  return s.ok() ? 0 : fail(s, a.dir);
}

int run_peek(const MessageArgs& a) {
  Status err;
  auto q = open_existing(a.dir, &err, a.sub);
  if (!q) return fail(err, a.dir);
  auto msgs = q->peek(a.n);
  if (!msgs.ok()) return fail(msgs.status(), a.dir);
  print_messages(*msgs, a.json, false);
  return 0;
}

// `s` as a shell word: as is when it holds only characters no shell treats specially,
// otherwise in single quotes (for the next-page command list prints).
std::string shell_word(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./-+,:=@") ==
                        std::string::npos) {
    return s;
  }
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

int run_list(const MessageArgs& a, size_t max, bool n_given) {
  StateFilter states{false, false, false, false};
  bool dead = a.states.empty();
  for (const auto& st : a.states) {
    if (st == "ready") states.ready = true;
    if (st == "in_flight") states.in_flight = true;
    if (st == "delayed") states.delayed = true;
    if (st == "blocked") states.blocked = true;
    if (st == "dead") dead = true;
  }
  if (a.states.empty()) states = StateFilter{};
  const bool live = states.ready || states.in_flight || states.delayed || states.blocked;
  const uint64_t after = a.after.empty() ? 0 : count_arg("--after", a.after);
  Status err;
  auto q = open_existing(a.dir, &err, a.sub);
  if (!q) return fail(err, a.dir);
  std::vector<MessageInfo> infos;
  if (live) {
    auto got = q->list(max, states, after);
    if (!got.ok()) return fail(got.status(), a.dir);
    infos = std::move(*got);
  }
  // Dead letters after the queue's messages, under their ids in the dead-letter queue
  // (as dlq list, show --dlq and delete --dlq take them). A queue that never had one
  // has none: list creates nothing (and a read-only user could not). --after is an id of
  // the queue's messages, or of the dead letters when only they are listed: so a page that
  // ends among the dead letters names its next page with --state dead.
  Queue* dlq = nullptr;
  struct stat dlq_conf {};
  if (dead && ::stat((a.dir + "/dlq/spool.conf").c_str(), &dlq_conf) == 0) {
    auto d = q->dead_letters();
    if (!d.ok()) return fail(d.status(), a.dir);
    dlq = *d;
  }
  std::vector<MessageInfo> dead_infos;
  if (dlq != nullptr && infos.size() < max) {
    auto got = dlq->list(max - infos.size(), StateFilter{}, live ? 0 : after);
    if (!got.ok()) return fail(got.status(), a.dir);
    dead_infos = std::move(*got);
  }
  if (!a.json) std::printf("%s\n", cli::list_header().c_str());
  for (const auto& m : infos) {
    std::printf("%s\n", a.json ? cli::info_json(m).dump().c_str() : cli::info_line(m).c_str());
  }
  for (const auto& m : dead_infos) {
    std::printf("%s\n", a.json ? cli::info_json(m, true).dump().c_str() : cli::info_line(m, true).c_str());
  }
  // Stopping at N is said, on stderr (stdout stays the rows): how many more there are after
  // the last row shown, and the command that lists them. (Counted after the listing, so a
  // message sent or taken in between makes it that much off.)
  const size_t shown = infos.size() + dead_infos.size();
  if (shown == 0 || shown < max) return 0;
  uint64_t more = 0, next_after = 0;
  std::string next_states;
  if (!dead_infos.empty()) {
    next_after = dead_infos.back().id;
    next_states = "dead";
    if (auto c = dlq->count(StateFilter{}, next_after); c.ok()) more = *c;
  } else {
    next_after = infos.back().id;
    for (const auto& st : a.states) next_states += (next_states.empty() ? "" : ",") + st;
    if (auto c = q->count(states, next_after); c.ok()) more = *c;
    if (dlq != nullptr) {
      if (auto c = dlq->count(); c.ok()) more += *c;
    }
  }
  if (more == 0) return 0;
  std::string next = "spool list " + shell_word(a.dir);
  if (n_given) next += " -n " + std::to_string(max);
  if (!next_states.empty()) next += " --state " + next_states;
  next += " --after " + std::to_string(next_after);
  std::fflush(stdout);
  std::fprintf(stderr, "spool: %zu shown, %" PRIu64 " more; next page: %s\n", shown, more, next.c_str());
  return 0;
}

// A message id given as an argument: 1 or more, digits only (a usage error otherwise).
uint64_t id_arg(const std::string& text) {
  const uint64_t id = count_arg("ID", text);
  if (id == 0) throw UsageError{"bad ID '0' (message ids start at 1)"};
  return id;
}

// The dead letter that was message `id` of the queue in `dir` (its spool.dead.original_id),
// or 0. Looks through at most kMaxLook dead letters (no payloads read): an error path, not a
// hot one.
uint64_t dead_letter_of(Queue& q, const std::string& dir, uint64_t id) {
  constexpr size_t kMaxLook = 100000;
  struct stat dlq_conf {};
  if (::stat((dir + "/dlq/spool.conf").c_str(), &dlq_conf) != 0) return 0;  // none: make none
  auto d = q.dead_letters();
  if (!d.ok()) return 0;
  auto infos = (*d)->list(kMaxLook);
  if (!infos.ok()) return 0;
  for (const auto& info : *infos) {
    if (info.original_id == id) return info.id;
  }
  return 0;
}

int run_show(const MessageArgs& a) {
  const uint64_t id = id_arg(a.id);
  Status err;
  auto q = open_existing(a.dir, &err, a.sub);
  if (!q) return fail(err, a.dir);
  auto which = queue_or_dead_letters(*q, a.dlq);
  if (!which.ok()) return fail(which.status(), a.dir);
  auto got = (*which)->show(id);
  if (!got.ok() && got.status().code() == Code::kNotFound && !a.dlq) {
    // A dead-lettered message is named by its id in the dead-letter queue (issue 43).
    if (const uint64_t dead = dead_letter_of(*q, a.dir, id); dead != 0) {
      std::fprintf(stderr, "spool: message %" PRIu64 " is not in the queue: it was dead-lettered, as dead letter %" PRIu64
                           " (spool show %s --dlq %" PRIu64 ")\n", id, dead, a.dir.c_str(), dead);
      return kExitError;
    }
  }
  if (!got.ok()) return fail(got.status(), a.dir);
  const auto& [m, info] = *got;
  const char* state = a.dlq ? "dead" : state_name(info.state);
  if (a.json) {
    auto j = cli::message_json(m);
    j.update(cli::info_json(info, a.dlq));  // state, size, age_s, due_at, holder_pid, original_id
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("id: %" PRIu64 "\nstate: %s\nreceive_count: %u\npriority: %u\nsize: %u\nenqueued: %s\n", m.id, state,
              info.receive_count, m.priority, info.size, cli::iso_time(m.enqueued).c_str());
  if (!m.group.empty()) std::printf("group: %s\n", m.group.c_str());
  if (!a.dlq && info.state != MessageState::kReady && info.state != MessageState::kBlocked) {
    std::printf("due: %s\n", cli::iso_time(info.due).c_str());
  }
  if (!a.dlq && info.holder_pid != 0) std::printf("holder_pid: %d\n", info.holder_pid);
  for (const auto& [k, v] : m.attributes) {
    std::printf("attribute: %s=%s\n", cli::one_line(k).c_str(), cli::one_line(v).c_str());
  }
  std::printf("---\n");
  std::fwrite(m.payload.data(), 1, m.payload.size(), stdout);
  std::printf("\n");
  return 0;
}

int run_purge(const MessageArgs& a) {
  if (!a.yes) throw UsageError{"purge deletes every message in " + a.dir + "; add --yes to confirm"};
  Status err;
  auto q = open_existing(a.dir, &err, a.sub);
  if (!q) return fail(err, a.dir);
  auto count = q->purge();
  if (!count.ok()) return fail(count.status(), a.dir);
  if (a.json) {
    std::printf("{\"purged\":%" PRIu64 "}\n", *count);  // as dlq purge --json
  } else {
    std::fprintf(stderr, "purged %" PRIu64 " %s\n", *count, *count == 1 ? "message" : "messages");
  }
  return 0;
}

int run_delete(const MessageArgs& a) {
  // Every id is checked before anything is deleted: a typo among them is a usage error
  // that changes nothing, not half a deletion.
  std::vector<uint64_t> ids;
  for (const auto& text : a.ids) {
    ids.push_back(id_arg(text));
  }
  Status err;
  auto q = open_existing(a.dir, &err, a.sub);
  if (!q) return fail(err, a.dir);
  auto which = queue_or_dead_letters(*q, a.dlq);
  if (!which.ok()) return fail(which.status(), a.dir);
  // An id that is not there does not stop the others: a script deleting a list wants as
  // much of it gone as can be, and the error names each id that was not there.
  int rc = 0;
  for (uint64_t id : ids) {
    if (Status s = (*which)->remove(id); !s.ok()) rc = fail(s, a.dir);
  }
  return rc;
}

const char* output() { return "its output"; }

}  // namespace

std::vector<Command> add_message_commands(CLI::App& app) {
  std::vector<Command> out;
  auto add = [&](const char* name, const char* what, int (*run)(const MessageArgs&)) {
    auto a = std::make_shared<MessageArgs>();
    auto* sub = app.add_subcommand(name, what);
    add_dir(sub, a->dir);
    out.push_back({sub, [a, run] { return run(*a); }});
    return std::pair{sub, a};
  };

  {
    auto [recv, a] = add("recv", "Receive (lease) messages", run_recv);
    add_subscription_flag(recv, a->sub);
    recv->add_option("-n", a->n, "Up to this many messages (default 1)")->check(CLI::Range(size_t{1}, size_t{100000}));
    recv->add_option("--visibility", a->visibility, "Lease length (default: the queue's)");
    recv->add_option("--wait", a->wait, "Long poll: wait up to this long for a message (default 0)");
    recv->add_flag("--json", a->json, "One JSON object per line: id, receipt, receive_count, priority, group (if any), enqueued_at, payload, attributes");
    recv->footer("Plain output: the payload byte for byte on stdout, 'receipt: R' on stderr.\n"
                 "Exit code 2 when no message arrived within --wait.\n"
                 "Example: spool recv q --wait 20s > job && ... && spool ack q RECEIPT");
    out.back().stdout_data = [] { return "the payload"; };
  }
  {
    auto [ack, a] = add("ack", "Acknowledge (delete) received messages", run_ack);
    add_subscription_flag(ack, a->sub);
    ack->add_option("RECEIPT", a->receipts, "Receipts printed by recv")->required();
    ack->add_flag("--durable", a->durable, "Return only once the ack is on disk, whatever the queue's --sync");
    ack->footer("Exit code 3 when a receipt is stale (its lease expired and the message was received again).\n"
                "Examples: spool ack q 17.1.9f3a22c1   |   spool recv q -n 10 --json | jq -r .receipt | xargs spool ack q");
  }
  {
    auto [nack, a] = add("nack", "Return a received message to the queue", run_nack);
    add_subscription_flag(nack, a->sub);
    nack->add_option("RECEIPT", a->receipt, "Receipt printed by recv")->required();
    nack->add_option("--delay", a->delay, "Ready again after this long (default now)");
    nack->footer("Exit codes as for ack. Example: spool nack q 17.1.9f3a22c1 --delay 30s");
  }
  {
    auto [extend, a] = add("extend", "Renew a lease to DUR from now", run_extend);
    add_subscription_flag(extend, a->sub);
    extend->add_option("RECEIPT", a->receipt, "Receipt printed by recv")->required();
    extend->add_option("DUR", a->dur, "New lease length")->required();
    extend->footer("Exit codes as for ack. Example: spool extend q 17.1.9f3a22c1 5m   (spool work renews its leases itself)");
  }
  {
    auto [peek, a] = add("peek", "Show messages without receiving them", run_peek);
    add_subscription_flag(peek, a->sub);
    peek->add_option("-n", a->n, "Up to this many, oldest first (default 1)");
    peek->add_flag("--json", a->json, "One JSON object per line");
    peek->footer("Ready, in flight and delayed messages alike; nothing is received.\n"
                 "Examples: spool peek q -n 5   |   spool peek q -n 100 --json | jq -r .payload");
    out.back().stdout_data = output;
  }
  {
    auto a = std::make_shared<MessageArgs>();
    auto* list = app.add_subcommand("list", "List messages with their state, without payloads");
    add_dir(list, a->dir);
    add_subscription_flag(list, a->sub);
    list->add_option("-n", a->n, "Up to this many, lowest ids first (default 100)");
    list->add_option("--after", a->after, "Only ids above ID: the next page (as the 'next page' line on stderr names it)");
    list->add_option("--state", a->states, "Only these: ready, in_flight, delayed, blocked (behind an earlier message of their group), dead (the dead letters)")
        ->delimiter(',')
        ->check(CLI::IsMember({"ready", "in_flight", "delayed", "blocked", "dead"}));
    list->add_flag("--json", a->json, "One JSON object per line");
    list->footer("Columns: ID STATE RECEIVES BYTES PRI (priority) AGE (since sent) DUE (lease end or delay end)\n"
                 "HOLDER (pid of a process whose lease is bound to its life) ORIGINAL (a dead letter's id in its queue)\n"
                 "GROUP (ordered group). Nothing is received, and nothing is written to the queue. When more than\n"
                 "N match, stderr says how many more and the command for the next page (--after the last id).\n"
                 "Examples: spool list q   |   spool list q --state in_flight,delayed   |   spool list q --after 100\n"
                 "          spool list q --json | jq .id");
    out.push_back({list, [a, list] {
                     const bool n_given = list->count("-n") != 0;
                     return run_list(*a, n_given ? a->n : 100, n_given);
                   }});
    out.back().stdout_data = output;
  }
  {
    auto [show, a] = add("show", "Show one message by id, in any state, without receiving it", run_show);
    add_subscription_flag(show, a->sub);
    show->add_option("ID", a->id, "Message id, as send, list or peek print it")->required();
    show->add_flag("--dlq", a->dlq, "ID is a dead letter's (as dlq list prints it)");
    show->add_flag("--json", a->json, "One JSON object");
    show->footer("Prints the state, receive count, enqueue and due time, holder, attributes, then the payload.\n"
                 "Exit 1 when the queue holds no message ID. Examples: spool show q 17   |   spool show q 17 --json");
    out.back().stdout_data = output;
  }
  {
    auto [purge, a] = add("purge", "Delete every message", run_purge);
    purge->add_flag("--yes", a->yes, "Confirm");
    purge->add_flag("--json", a->json, "Print {\"purged\":N} on stdout instead of the line on stderr");
    purge->footer("Deletes every message (not the dead letters). Example: spool purge /var/spool/jobs --yes");
  }
  {
    auto [del, a] = add("delete", "Delete messages by id, in any state, without a receipt", run_delete);
    del->add_option("ID", a->ids, "Message ids, as send, peek or dlq list print them")->required();
    del->add_flag("--dlq", a->dlq, "The ids are those of dead letters (as dlq list prints them)");
    del->footer("Ready, in flight and delayed messages alike; a receipt held for a deleted message then fails.\n"
                "An id not in the queue is reported and the others are still deleted (exit 1).\n"
                "Examples: spool delete q 17 18   |   spool delete q --dlq 3");
  }
  return out;
}

}  // namespace spool::cmd
