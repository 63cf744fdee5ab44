#!/bin/bash
# The SQS face with aws-cli (query protocol) and signed curl requests (JSON 1.0,
# X-Amz-Target), unchanged, against spool-serve on a free 127.0.0.1 port; and `spool serve`
# running it. Usage: sqs_cli_test.sh SPOOL_SERVE SPOOL. TAP output.
set -uo pipefail
SERVE=$1 SPOOL=$2
for tool in aws curl python3; do
  command -v $tool >/dev/null || { echo "1..0 # SKIP $tool is not installed (scripts/deps.sh --test installs it)"; exit 0; }
done
T=$(mktemp -d)
PID=
trap '[ -n "$PID" ] && kill $PID 2>/dev/null; wait 2>/dev/null; rm -rf "$T"' EXIT
mkdir "$T/root"
KEY=AKIDCLITEST SECRET=cli-secret
printf '[default]\naws_access_key_id = %s\naws_secret_access_key = %s\n' $KEY $SECRET > "$T/credentials"
printf '[default]\nregion = us-east-1\noutput = json\n' > "$T/config"
export AWS_SHARED_CREDENTIALS_FILE="$T/credentials" AWS_CONFIG_FILE="$T/config" AWS_PAGER=""
unset AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_PROFILE AWS_REGION AWS_DEFAULT_REGION
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
URL=http://127.0.0.1:$PORT
# Through `spool serve`, which runs spool-serve.
"$SPOOL" serve "$T/root" --sqs 127.0.0.1:$PORT --credentials "$T/credentials" & PID=$!
for _ in $(seq 100); do curl -s -o /dev/null "$URL/" && break; sleep 0.05; done

n=0 failed=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else failed=$((failed + 1)); echo "not ok $n - $2"; fi; }
echo "1..12"
aws() { command aws --endpoint-url "$URL" "$@"; }
jq_() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

Q=$(aws sqs create-queue --queue-name cli-jobs | jq_ 'd["QueueUrl"]')
[ "$Q" = "$URL/000000000000/cli-jobs" ] && [ -f "$T/root/cli-jobs/spool.conf" ]; ok $? "aws sqs create-queue makes ROOT/NAME ($Q)"
ID=$(aws sqs send-message --queue-url "$Q" --message-body "hello from aws-cli" \
  --message-attributes '{"kind":{"DataType":"String","StringValue":"greeting"}}' | jq_ 'd["MessageId"]')
[ -n "$ID" ]; ok $? "aws sqs send-message returns a MessageId"
# The message is a spool message: the CLI sees it, with its attribute under sqs.a.
"$SPOOL" peek "$T/root/cli-jobs" --json | grep -q '"sqs.a.kind":"String:greeting"'; ok $? "spool peek shows the message and its attribute"
R=$(aws sqs receive-message --queue-url "$Q" --message-attribute-names All --attribute-names All)
[ "$(echo "$R" | jq_ 'd["Messages"][0]["Body"]')" = "hello from aws-cli" ] &&
  [ "$(echo "$R" | jq_ 'd["Messages"][0]["MessageAttributes"]["kind"]["StringValue"]')" = greeting ]
ok $? "aws sqs receive-message gets the body and the attribute"
H=$(echo "$R" | jq_ 'd["Messages"][0]["ReceiptHandle"]')
aws sqs delete-message --queue-url "$Q" --receipt-handle "$H" &&
  [ "$(aws sqs get-queue-attributes --queue-url "$Q" --attribute-names All | jq_ 'd["Attributes"]["ApproximateNumberOfMessagesNotVisible"]')" = 0 ]
ok $? "aws sqs delete-message acks it"
aws sqs get-queue-url --queue-name nope 2> "$T/err"; rc=$?
[ $rc != 0 ] && grep -q "NonExistentQueue" "$T/err"; ok $? "a missing queue: AWS.SimpleQueueService.NonExistentQueue ($(tr -d '\n' < "$T/err" | cut -c1-120))"

# A queue made by the CLI with back-pressure: a send beyond it is SQS's throttling, which SDKs
# retry with backoff.
"$SPOOL" init "$T/root/full" --max-ready 1 >/dev/null
FQ=$URL/000000000000/full
aws sqs send-message --queue-url "$FQ" --message-body 1 >/dev/null &&
  ! AWS_MAX_ATTEMPTS=1 aws sqs send-message --queue-url "$FQ" --message-body 2 2> "$T/err" &&
  grep -q ThrottlingException "$T/err"
ok $? "a send to a full queue (spool init --max-ready 1): ThrottlingException ($(tr -d '\n' < "$T/err" | cut -c1-100))"

# JSON 1.0 with curl's own SigV4 signing.
sqsj() {  # ACTION JSON [curl args...]
  local action=$1 body=$2; shift 2
  curl -s -D "$T/headers" --aws-sigv4 "aws:amz:us-east-1:sqs" --user "$KEY:$SECRET" \
    -H "X-Amz-Target: AmazonSQS.$action" -H "Content-Type: application/x-amz-json-1.0" -d "$body" "$@" "$URL/"
}
J=$(sqsj CreateQueue '{"QueueName":"json-jobs","Attributes":{"VisibilityTimeout":"5"}}')
JQ=$(echo "$J" | jq_ 'd["QueueUrl"]')
[ "$JQ" = "$URL/000000000000/json-jobs" ]; ok $? "JSON 1.0 CreateQueue ($J)"
S=$(sqsj SendMessage "{\"QueueUrl\":\"$JQ\",\"MessageBody\":\"json body\",\"MessageAttributes\":{\"n\":{\"DataType\":\"Number\",\"StringValue\":\"42\"}}}")
MD5=$(printf 'json body' | md5sum | cut -c1-32)
[ "$(echo "$S" | jq_ 'd["MD5OfMessageBody"]')" = "$MD5" ]; ok $? "JSON 1.0 SendMessage: MD5OfMessageBody ($S)"
R=$(sqsj ReceiveMessage "{\"QueueUrl\":\"$JQ\",\"MaxNumberOfMessages\":10,\"WaitTimeSeconds\":1,\"MessageAttributeNames\":[\"All\"],\"AttributeNames\":[\"ApproximateReceiveCount\"]}")
[ "$(echo "$R" | jq_ 'd["Messages"][0]["Body"], d["Messages"][0]["MessageAttributes"]["n"]["StringValue"], d["Messages"][0]["Attributes"]["ApproximateReceiveCount"]')" = "json body 42 1" ] &&
  grep -qi "^content-type: application/x-amz-json-1.0" "$T/headers"
ok $? "JSON 1.0 ReceiveMessage ($R)"
E=$(sqsj GetQueueUrl '{"QueueName":"missing"}')
[ "$(echo "$E" | jq_ 'd["__type"]')" = "com.amazonaws.sqs#QueueDoesNotExist" ] &&
  grep -qi "^x-amzn-query-error: AWS.SimpleQueueService.NonExistentQueue;Sender" "$T/headers" &&
  grep -q "^HTTP/1.1 400" "$T/headers"
ok $? "JSON 1.0 error: __type, x-amzn-query-error, 400 ($E)"
code=$(curl -s -o /dev/null -w '%{http_code}' --aws-sigv4 "aws:amz:us-east-1:sqs" --user "$KEY:wrong-secret" \
  -H "X-Amz-Target: AmazonSQS.ListQueues" -H "Content-Type: application/x-amz-json-1.0" -d '{}' "$URL/")
ucode=$(curl -s -o /dev/null -w '%{http_code}' -H "X-Amz-Target: AmazonSQS.ListQueues" \
  -H "Content-Type: application/x-amz-json-1.0" -d '{}' "$URL/")
[ "$code" = 403 ] && [ "$ucode" = 403 ]; ok $? "a wrong secret and an unsigned request: 403 ($code, $ucode)"
[ $failed = 0 ]
