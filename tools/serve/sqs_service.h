// The SQS actions over spool queues, independent of the wire protocol: each action takes its
// input and returns its output as JSON objects in the shapes of SQS's JSON 1.0 protocol
// (docs/sqs.md); the query protocol is translated to and from them (sqs_wire.h).
//
// A queue named NAME is the spool queue ROOT/NAME, shared with the CLI, the library and
// spoolfs. What SQS knows of a queue that spool's spool.conf does not hold (FifoQueue,
// DelaySeconds, ReceiveMessageWaitTimeSeconds, ContentBasedDeduplication, tags, the creation
// time) is kept in ROOT/.sqs/NAME.json; a queue without that file is a standard queue.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "spool/queue.h"

namespace spool::serve {

using nlohmann::json;

// An SQS error: `name` is the JSON protocol's short code (QueueDoesNotExist, ...); the query
// protocol's code and the HTTP status follow from it (sqs_wire.h).
struct SqsError {
  std::string name;
  std::string message;
};

// What the transport knows of a request.
struct SqsContext {
  std::string base_url;    // "http://HOST:PORT", from the request's Host header
  std::string region;      // from the signature's scope, or the server's --region
  std::string path_queue;  // a queue name from the request path (/ACCOUNT/NAME), or empty
};

class SqsService {
 public:
  static constexpr const char* kAccount = "000000000000";
  explicit SqsService(std::string root);
  ~SqsService();
  // Runs `action` on `in`; the output object, or the error. Thread-safe.
  json call(const std::string& action, const json& in, const SqsContext& ctx);  // throws SqsError
  // Ends the long polls under way within about a second (at shutdown).
  void stop() { stopping_ = true; }

  struct Meta {  // ROOT/.sqs/NAME.json
    bool fifo = false;
    bool content_dedup = false;
    int64_t delay_s = 0;
    int64_t wait_s = 0;
    int64_t created_s = 0;
    int64_t modified_s = 0;
    std::map<std::string, std::string>
        extra;  // accepted attributes with no effect (Policy, Kms*, ...)
    std::map<std::string, std::string> tags;
    std::string dlq;  // RedrivePolicy's dead-letter queue, or empty
  };

 private:
  struct Open {
    std::shared_ptr<Queue> q;
    Meta meta;
  };
  std::shared_ptr<Open> open(const std::string& name);  // throws QueueDoesNotExist
  // The queue a request names (QueueUrl, else the path); its name in *name.
  std::shared_ptr<Open> open_from(const json& in, const SqsContext& ctx, std::string* name);
  void save_meta(const std::string& name, const Meta& m);
  std::string url(const SqsContext& ctx, const std::string& name) const;
  std::string arn(const SqsContext& ctx, const std::string& name) const;
  std::string message_id(const std::string& name, const Meta& m, uint64_t id) const;
  json queue_attributes(const std::string& name, Open& o, const SqsContext& ctx);

  json create_queue(const json& in, const SqsContext& ctx);
  json list_queues(const json& in, const SqsContext& ctx);
  json delete_queue(const json& in, const SqsContext& ctx);
  json get_attributes(const json& in, const SqsContext& ctx);
  json set_attributes(const json& in, const SqsContext& ctx);
  json send(const json& in, const SqsContext& ctx, bool batch);
  json receive(const json& in, const SqsContext& ctx);
  json delete_message(const json& in, const SqsContext& ctx, bool batch);
  json change_visibility(const json& in, const SqsContext& ctx, bool batch);
  json dead_letter_sources(const json& in, const SqsContext& ctx);
  json tags(const std::string& action, const json& in, const SqsContext& ctx);
  json move_task(const std::string& action, const json& in, const SqsContext& ctx);
  // Redrive to a named queue: spool dead-letters a queue's messages into its own DIR/dlq (and
  // opens no link there), so a thread moves them on into the RedrivePolicy's queue every
  // half second. redrives(): source -> dead-letter queue, from ROOT/.sqs.
  std::map<std::string, std::string> redrives();
  void pump(const std::string& source, const std::string& target);
  void pump_loop();

  const std::string root_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;  // guards open_, first_receive_ and moves_
  std::map<std::string, std::shared_ptr<Open>> open_;
  // ApproximateFirstReceiveTimestamp: spool keeps no first-receive time, so this process
  // remembers the ones it handed out ("queue/id" -> ms since the epoch) until the delete.
  std::map<std::string, int64_t> first_receive_;
  // The last 10 message-move tasks of each source queue, for ListMessageMoveTasks.
  std::map<std::string, std::vector<json>> moves_;
  std::mutex pump_mu_;                                   // guards pumps_ and one pump at a time
  std::map<std::string, std::unique_ptr<Queue>> pumps_;  // SOURCE/dlq queues
  std::thread pump_thread_;
};

}  // namespace spool::serve
