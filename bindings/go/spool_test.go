package spool_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"spool"
)

func create(t testing.TB, opts *spool.Options) *spool.Queue {
	t.Helper()
	q, err := spool.Create(t.TempDir()+"/q", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

func receiveOne(t *testing.T, q *spool.Queue, vis time.Duration) *spool.Message {
	t.Helper()
	msgs, err := q.Receive(context.Background(), 1, vis, time.Second)
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	return msgs[0]
}

func TestSendReceiveAck(t *testing.T) {
	q := create(t, nil)
	ctx := context.Background()
	id, err := q.Send(ctx, []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	m := receiveOne(t, q, 0)
	if m.ID != id || string(m.Payload) != "hello" || m.ReceiveCount != 1 || m.Priority != 128 {
		t.Fatalf("got %+v, want id %d payload hello", m, id)
	}
	if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
	if err := m.Ack(); !errors.Is(err, spool.ErrNotFound) {
		t.Fatalf("second ack: %v, want ErrNotFound", err)
	}
	if _, err := q.Receive(ctx, 1, 0, 0); !errors.Is(err, spool.ErrEmpty) {
		t.Fatalf("receive of an empty queue: %v, want ErrEmpty", err)
	}
	st, err := q.Stats()
	if err != nil || st.SentTotal != 1 || st.AckedTotal != 1 || st.Ready != 0 {
		t.Fatalf("stats %+v, %v", st, err)
	}
}

func TestOpenOfNoQueueIsErrNotAQueue(t *testing.T) {
	_, err := spool.Open(t.TempDir() + "/none")
	var e *spool.Error
	if !errors.Is(err, spool.ErrNotAQueue) || !errors.As(err, &e) || e.Message == "" {
		t.Fatalf("open: %v, want ErrNotAQueue with a message", err)
	}
}

func TestOptionsReachTheMessage(t *testing.T) {
	q := create(t, nil)
	ctx := context.Background()
	if _, err := q.Send(ctx, []byte("late"), spool.WithPriority(200)); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Send(ctx, []byte("first"), spool.WithPriority(0), spool.WithGroup("acct-17"),
		spool.WithAttribute("trace", []byte("7f3a")), spool.WithAttribute("n", []byte{0, 1})); err != nil {
		t.Fatal(err)
	}
	m := receiveOne(t, q, 0)
	if string(m.Payload) != "first" || m.Priority != 0 || string(m.Group) != "acct-17" ||
		string(m.Attributes["trace"]) != "7f3a" || !bytes.Equal(m.Attributes["n"], []byte{0, 1}) {
		t.Fatalf("got %+v", m)
	}
	a, err := q.Send(ctx, []byte("x"), spool.WithDedupID("order-1"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := q.Send(ctx, []byte("x again"), spool.WithDedupID("order-1"))
	if err != nil || a != b {
		t.Fatalf("duplicate send: id %d (%v), want %d", b, err, a)
	}
	if _, err := q.Send(ctx, []byte("x"), spool.WithAttribute("bad key!", nil)); !errors.Is(err, spool.ErrInvalidArgument) {
		t.Fatalf("bad attribute key: %v, want ErrInvalidArgument", err)
	}
	ids, err := q.SendBatch(ctx, [][]byte{[]byte("b1"), {}, []byte("b3")}, spool.WithDelay(time.Hour))
	if err != nil || len(ids) != 3 || ids[1] != ids[0]+1 || ids[2] != ids[0]+2 {
		t.Fatalf("batch: %v %v", ids, err)
	}
	if st, _ := q.Stats(); st.Delayed != 3 {
		t.Fatalf("delayed %d, want 3", st.Delayed)
	}
}

// A receipt whose lease expired and was received again fails with ErrLeaseLost.
func TestStaleReceiptIsLeaseLost(t *testing.T) {
	q := create(t, nil)
	q.Send(context.Background(), []byte("job"))
	first := receiveOne(t, q, 50*time.Millisecond)
	time.Sleep(120 * time.Millisecond)
	second := receiveOne(t, q, 0)
	if second.ReceiveCount != 2 {
		t.Fatalf("receive count %d, want 2", second.ReceiveCount)
	}
	for name, err := range map[string]error{"ack": first.Ack(), "nack": first.Nack(0),
		"extend": first.Extend(time.Second)} {
		if !errors.Is(err, spool.ErrLeaseLost) {
			t.Fatalf("%s of the stale receipt: %v, want ErrLeaseLost", name, err)
		}
	}
	if err := second.Extend(time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := second.Nack(0); err != nil {
		t.Fatal(err)
	}
	if m := receiveOne(t, q, 0); m.ReceiveCount != 3 {
		t.Fatalf("after nack: receive count %d, want 3", m.ReceiveCount)
	}
}

// AckBatch acks each good receipt and gives every other one the error Ack would have.
func TestAckBatchAcksManyAndTellsEachReceiptsOutcome(t *testing.T) {
	q := create(t, &spool.Options{Visibility: time.Minute})
	ctx := context.Background()
	if _, err := q.SendBatch(ctx, [][]byte{[]byte("a"), []byte("b"), []byte("c"), []byte("d")}); err != nil {
		t.Fatal(err)
	}
	msgs, err := q.Receive(ctx, 3, 0, time.Second)
	if err != nil || len(msgs) != 3 {
		t.Fatalf("receive: %d messages, %v", len(msgs), err)
	}
	out, err := q.AckBatchSync([]string{msgs[0].Receipt(), msgs[1].Receipt(), "garbage", msgs[0].Receipt()})
	if err != nil || len(out) != 4 {
		t.Fatalf("AckBatchSync: %v, %v", out, err)
	}
	if out[0] != nil || out[1] != nil {
		t.Fatalf("the good receipts: %v, %v, want nil, nil", out[0], out[1])
	}
	var e *spool.Error
	if !errors.Is(out[2], spool.ErrInvalidArgument) || !errors.As(out[2], &e) || !strings.Contains(e.Message, "garbage") {
		t.Fatalf("garbage: %v, want ErrInvalidArgument naming it", out[2])
	}
	if !errors.Is(out[3], spool.ErrNotFound) { // given twice: acked by the first
		t.Fatalf("a receipt given twice: %v, want ErrNotFound", out[3])
	}
	if out, err := q.AckBatch(nil); err != nil || len(out) != 0 {
		t.Fatalf("an empty batch: %v, %v", out, err)
	}
	st, err := q.Stats()
	if err != nil || st.AckedTotal != 2 || st.InFlight != 1 || st.Ready != 1 {
		t.Fatalf("stats acked %d in flight %d ready %d (%v), want 2, 1, 1", st.AckedTotal, st.InFlight, st.Ready, err)
	}
	if out, err := q.AckBatch([]string{msgs[2].Receipt()}); err != nil || len(out) != 1 || out[0] != nil {
		t.Fatalf("AckBatch of the third: %v, %v", out, err)
	}
	if st, _ := q.Stats(); st.AckedTotal != 3 {
		t.Fatalf("acked %d after the third, want 3", st.AckedTotal)
	}
	if _, err := q.AckBatch([]string{"a\x00b"}); !errors.Is(err, spool.ErrInvalidArgument) {
		t.Fatalf("a receipt with a NUL: %v, want ErrInvalidArgument for the call", err)
	}
	q.Close()
	if out, err := q.AckBatch([]string{msgs[0].Receipt()}); out != nil || err != spool.ErrClosed {
		t.Fatalf("after Close: %v, %v, want nil, ErrClosed", out, err)
	}
}

func TestBackPressureIsErrQueueFull(t *testing.T) {
	q := create(t, &spool.Options{MaxReady: 2})
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if _, err := q.Send(ctx, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := q.Send(ctx, []byte("x")); !errors.Is(err, spool.ErrQueueFull) {
		t.Fatalf("third send: %v, want ErrQueueFull", err)
	}
}

// A long poll ends promptly when its context is cancelled or the queue is closed, and wakes
// at once for a send.
func TestLongPollEndsOnCancelCloseAndSend(t *testing.T) {
	q := create(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := q.Receive(ctx, 1, 0, time.Minute)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
		t.Fatalf("cancelled poll: %v after %v", err, time.Since(start))
	}

	go func() { time.Sleep(50 * time.Millisecond); q.Send(context.Background(), []byte("wake")) }()
	start = time.Now()
	if m, err := q.Receive(context.Background(), 1, 0, time.Minute); err != nil || string(m[0].Payload) != "wake" {
		t.Fatalf("poll woken by a send: %v %v", m, err)
	}
	if time.Since(start) > time.Second {
		t.Fatalf("woken after %v", time.Since(start))
	}

	q2 := create(t, nil)
	done := make(chan error)
	go func() { _, err := q2.Receive(context.Background(), 1, 0, time.Minute); done <- err }()
	time.Sleep(50 * time.Millisecond)
	start = time.Now()
	q2.Close()
	if err := <-done; !errors.Is(err, spool.ErrClosed) || time.Since(start) > time.Second {
		t.Fatalf("poll of a closed queue: %v after %v", err, time.Since(start))
	}
	if _, err := q2.Send(context.Background(), nil); !errors.Is(err, spool.ErrClosed) {
		t.Fatalf("send after close: %v", err)
	}
}

// Goroutines sending and receiving at once on one Queue: every message exactly once
// (run under -race by the meson test).
func TestConcurrentSendersAndReceivers(t *testing.T) {
	q := create(t, nil)
	const senders, per, receivers = 4, 250, 4
	var seen sync.Map
	var wg sync.WaitGroup
	errs := make(chan error, senders+receivers)
	for s := 0; s < senders; s++ {
		wg.Add(1)
		go func(s int) {
			defer wg.Done()
			for i := 0; i < per; i++ {
				if _, err := q.Send(context.Background(), []byte(fmt.Sprintf("%d-%d", s, i))); err != nil {
					errs <- err
					return
				}
			}
		}(s)
	}
	var received sync.WaitGroup
	var count sync.Mutex
	total := 0
	for r := 0; r < receivers; r++ {
		received.Add(1)
		go func() {
			defer received.Done()
			for {
				msgs, err := q.Receive(context.Background(), 8, 0, 300*time.Millisecond)
				if errors.Is(err, spool.ErrEmpty) {
					return
				} else if err != nil {
					errs <- err
					return
				}
				for _, m := range msgs {
					if _, dup := seen.LoadOrStore(string(m.Payload), true); dup {
						errs <- fmt.Errorf("%s received twice", m.Payload)
					}
					if err := m.Ack(); err != nil {
						errs <- err
					}
				}
				count.Lock()
				total += len(msgs)
				count.Unlock()
			}
		}()
	}
	wg.Wait()
	received.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if total != senders*per {
		t.Fatalf("received %d, want %d", total, senders*per)
	}
}

// cpuTimer reports the process's CPU time per operation (user + system) beside ns/op: on a
// loaded machine the wall time mostly measures waiting for a core (bench/bench_bindings.sh).
func cpuTimer(b *testing.B) func() {
	cpu := func() time.Duration {
		var ru syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start := cpu()
	return func() { b.ReportMetric(float64(cpu()-start)/float64(b.N), "cpu-ns/op") }
}

func BenchmarkSend(b *testing.B) {
	q := create(b, &spool.Options{SegmentSize: 256 << 20})
	payload := make([]byte, 64)
	ctx := context.Background()
	b.ResetTimer()
	defer cpuTimer(b)()
	for i := 0; i < b.N; i++ {
		if _, err := q.Send(ctx, payload); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSendBatch100(b *testing.B) {
	q := create(b, &spool.Options{SegmentSize: 256 << 20})
	batch := make([][]byte, 100)
	for i := range batch {
		batch[i] = make([]byte, 64)
	}
	ctx := context.Background()
	b.ResetTimer()
	defer cpuTimer(b)()
	for i := 0; i < b.N; i++ {
		if _, err := q.SendBatch(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReceiveAck(b *testing.B) {
	q := create(b, &spool.Options{SegmentSize: 256 << 20})
	ctx := context.Background()
	payload := make([]byte, 64)
	for i := 0; i < b.N; i++ {
		q.Send(ctx, payload)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		msgs, err := q.Receive(ctx, 1, 0, 0)
		if err != nil {
			b.Fatal(err)
		}
		if err := msgs[0].Ack(); err != nil {
			b.Fatal(err)
		}
	}
}
