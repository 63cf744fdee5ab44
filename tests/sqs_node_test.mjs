// The SQS face with a current AWS SDK, unchanged: @aws-sdk/client-sqs v3 under node, which
// speaks JSON 1.0 and checks the MD5s of the bodies it sends and receives. Run by sqs_node_test.sh:
// node sqs_node_test.mjs SDK_DIR ENDPOINT KEY SECRET. TAP output.
import { createRequire } from "node:module";
import crypto from "node:crypto";

const [sdkDir, endpoint, key, secret] = process.argv.slice(2);
const require = createRequire(sdkDir + "/");
const sqs = require("@aws-sdk/client-sqs");
const client = new sqs.SQSClient({ endpoint, region: "us-east-1", credentials: { accessKeyId: key, secretAccessKey: secret },
                                   maxAttempts: 1 });
const send = (Cmd, input) => client.send(new Cmd(input));
let n = 0, failed = 0;
async function check(name, fn) {
  n++;
  try { await fn(); console.log(`ok ${n} - ${name}`); }
  catch (e) { failed++; console.log(`not ok ${n} - ${name}: ${e.name}: ${e.message}`); }
}
function eq(a, b, what) { if (JSON.stringify(a) !== JSON.stringify(b)) throw new Error(`${what}: ${JSON.stringify(a)} != ${JSON.stringify(b)}`); }

console.log("1..7");
let url;
await check("CreateQueue, GetQueueUrl, GetQueueAttributes", async () => {
  url = (await send(sqs.CreateQueueCommand, { QueueName: "node-jobs", Attributes: { VisibilityTimeout: "20" } })).QueueUrl;
  eq((await send(sqs.GetQueueUrlCommand, { QueueName: "node-jobs" })).QueueUrl, url, "url");
  const a = (await send(sqs.GetQueueAttributesCommand, { QueueUrl: url, AttributeNames: ["All"] })).Attributes;
  eq(a.VisibilityTimeout, "20", "VisibilityTimeout");
});
const attrs = { s: { DataType: "String", StringValue: "héllo" }, n: { DataType: "Number", StringValue: "3.5" },
                b: { DataType: "Binary", BinaryValue: new Uint8Array([0, 1, 2, 255]) } };
await check("SendMessage and SendMessageBatch with attributes of every type (the SDK checks MD5OfBody and MD5OfMessageBody)", async () => {
  const r = await send(sqs.SendMessageCommand, { QueueUrl: url, MessageBody: "one", MessageAttributes: attrs });
  eq(r.MD5OfMessageBody, crypto.createHash("md5").update("one").digest("hex"), "md5");
  const b = await send(sqs.SendMessageBatchCommand, { QueueUrl: url, Entries: [
    { Id: "a", MessageBody: "two", MessageAttributes: attrs }, { Id: "b", MessageBody: "three" }] });
  eq(b.Successful.length, 2, "successful");
});
await check("ReceiveMessage, ChangeMessageVisibility, DeleteMessageBatch", async () => {
  let got = [];
  for (let i = 0; i < 5 && got.length < 3; i++) {
    const r = await send(sqs.ReceiveMessageCommand, { QueueUrl: url, MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
                                                       MessageAttributeNames: ["All"], AttributeNames: ["All"] });
    got = got.concat(r.Messages ?? []);
  }
  eq(got.map((m) => m.Body).sort(), ["one", "three", "two"], "bodies");
  const one = got.find((m) => m.Body === "one");
  eq(Array.from(one.MessageAttributes.b.BinaryValue), [0, 1, 2, 255], "binary attribute");
  eq(one.MessageAttributes.s.StringValue, "héllo", "string attribute");
  await send(sqs.ChangeMessageVisibilityCommand, { QueueUrl: url, ReceiptHandle: one.ReceiptHandle, VisibilityTimeout: 30 });
  const d = await send(sqs.DeleteMessageBatchCommand, { QueueUrl: url,
    Entries: got.map((m, i) => ({ Id: `d${i}`, ReceiptHandle: m.ReceiptHandle })) });
  eq(d.Successful.length, 3, "deleted");
});
await check("a FIFO queue keeps a group's order", async () => {
  const f = (await send(sqs.CreateQueueCommand, { QueueName: "node.fifo", Attributes: { FifoQueue: "true", ContentBasedDeduplication: "true" } })).QueueUrl;
  for (const body of ["1", "2", "3"]) await send(sqs.SendMessageCommand, { QueueUrl: f, MessageBody: body, MessageGroupId: "g" });
  const order = [];
  for (let i = 0; i < 6 && order.length < 3; i++) {
    const r = await send(sqs.ReceiveMessageCommand, { QueueUrl: f, MaxNumberOfMessages: 10 });
    for (const m of r.Messages ?? []) { order.push(m.Body); await send(sqs.DeleteMessageCommand, { QueueUrl: f, ReceiptHandle: m.ReceiptHandle }); }
  }
  eq(order, ["1", "2", "3"], "order");
});
await check("a missing queue is QueueDoesNotExist", async () => {
  try { await send(sqs.GetQueueUrlCommand, { QueueName: "missing" }); } catch (e) {
    if (e.name !== "QueueDoesNotExist" && e.Code !== "AWS.SimpleQueueService.NonExistentQueue") throw e;
    return;
  }
  throw new Error("no error");
});
await check("a wrong secret is refused with 403", async () => {
  const bad = new sqs.SQSClient({ endpoint, region: "us-east-1", credentials: { accessKeyId: key, secretAccessKey: "wrong" }, maxAttempts: 1 });
  try { await bad.send(new sqs.ListQueuesCommand({})); } catch (e) {
    eq(e.$metadata.httpStatusCode, 403, "status");
    return;
  }
  throw new Error("accepted");
});
await check("redrive: StartMessageMoveTask moves the dead letters back, ListMessageMoveTasks reports it", async () => {
  const dlq = (await send(sqs.CreateQueueCommand, { QueueName: "node-dlq" })).QueueUrl;
  const dlqArn = (await send(sqs.GetQueueAttributesCommand, { QueueUrl: dlq, AttributeNames: ["QueueArn"] })).Attributes.QueueArn;
  const src = (await send(sqs.CreateQueueCommand, { QueueName: "node-src", Attributes: {
    RedrivePolicy: JSON.stringify({ deadLetterTargetArn: dlqArn, maxReceiveCount: 1 }) } })).QueueUrl;
  await send(sqs.SendMessageCommand, { QueueUrl: src, MessageBody: "poison", MessageAttributes: { k: { DataType: "String", StringValue: "v" } } });
  eq((await send(sqs.ReceiveMessageCommand, { QueueUrl: src, VisibilityTimeout: 0 })).Messages.length, 1, "first delivery");
  eq((await send(sqs.ReceiveMessageCommand, { QueueUrl: src, WaitTimeSeconds: 1 })).Messages, undefined, "dead-lettered");
  const t = await send(sqs.StartMessageMoveTaskCommand, { SourceArn: dlqArn });
  const list = (await send(sqs.ListMessageMoveTasksCommand, { SourceArn: dlqArn })).Results;
  eq([list[0].TaskHandle, list[0].Status, list[0].ApproximateNumberOfMessagesMoved], [t.TaskHandle, "COMPLETED", 1], "task");
  const back = (await send(sqs.ReceiveMessageCommand, { QueueUrl: src, MessageAttributeNames: ["All"] })).Messages[0];
  eq([back.Body, back.MessageAttributes.k.StringValue], ["poison", "v"], "moved back");
});
process.exit(failed ? 1 : 0);
