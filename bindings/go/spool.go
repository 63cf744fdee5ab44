// Package spool is the Go binding of spool, a persistent, brokerless message queue for worker
// processes on one host. A queue is a directory that any number of processes (Go, C, C++,
// Python, Node.js, the spool CLI) open at once; no daemon is involved. Delivery is
// at-least-once with leases: a received message is hidden for its visibility timeout and
// comes back if it is not acked in time; an ack with a lease that was lost fails with
// ErrLeaseLost instead of "succeeding".
//
// The package wraps the C API of libspool (spool.h) with cgo; the C library is found with
// pkg-config (`pkg-config --cflags --libs spool`). Semantics: docs/semantics.md; this
// binding: docs/go.md.
//
// Blocking: every call is a cgo call, which holds its OS thread (the Go runtime starts
// another for the other goroutines meanwhile). A long poll (Receive with a wait) is made of
// waits of at most 100 ms, between which the context and Close are checked, so a poll
// neither outlives its context by more than that nor keeps Close waiting.
//
// A Queue may be used by any number of goroutines at once.
package spool

// #cgo pkg-config: spool
// #include <stdlib.h>
// #include <string.h>
// #include <spool/spool.h>
import "C"

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// pollSlice bounds one wait inside the C library: a cancelled context or a Close is seen
// within it. A message arriving wakes the wait at once whatever its length.
const pollSlice = 100 * time.Millisecond

// SyncPolicy is when a queue's writes reach the disk (docs/durability.md).
type SyncPolicy int

const (
	SyncDefault  SyncPolicy = iota // the library's default: SyncInterval
	SyncAlways                     // send and ack return only once on disk (group commit)
	SyncInterval                   // synced at most SyncInterval after a write
	SyncNever                      // left to the kernel's writeback
)

// Options are the settings stored when a queue is created (Create); opening an existing
// queue keeps its own. A zero field means the library's default.
type Options struct {
	Visibility        time.Duration // default lease of Receive; 30 s
	MaxReceives       int           // deliveries before dead-lettering; 10; negative: never
	Sync              SyncPolicy    // SyncInterval
	SyncInterval      time.Duration // 50 ms
	SegmentSize       uint64        // bytes per segment file; 64 MiB
	MaxPayload        uint64        // largest message; 1 MiB
	RetentionMaxAge   time.Duration // drop ready messages older than this; off
	RetentionMaxBytes uint64        // drop the oldest ready messages past this; off
	MaxReady          uint64        // back-pressure: ready+delayed limit (ErrQueueFull); off
	MaxBytes          uint64        // back-pressure: payload bytes limit; off
	DedupWindow       time.Duration // how long a dedup id is remembered; 5 min
	KeepAcked         time.Duration // keep acked messages for replay; off
}

// Queue is an open queue. Close it when done; every method is safe for concurrent use.
type Queue struct {
	// mu is held shared by every call on h and exclusively by Close, so h is never closed
	// under a running call.
	mu     sync.RWMutex
	h      *C.spool_queue
	closed atomic.Bool // set first by Close, so long polls stop at their next slice
}

func ms(d time.Duration) C.uint64_t {
	if d <= 0 {
		return 0
	}
	return C.uint64_t((d + time.Millisecond - 1) / time.Millisecond)
}

// lastError turns a failed call's code into an error; it must run on the OS thread of that
// call (spool_last_error is per thread): callers hold runtime.LockOSThread across both.
func lastError(rc C.spool_code) error {
	switch rc {
	case C.SPOOL_OK:
		return nil
	case C.SPOOL_EMPTY:
		return ErrEmpty
	}
	return &Error{Code: Code(rc), Message: C.GoString(C.spool_last_error())}
}

// Open opens the existing queue in dir (ErrNotAQueue if there is none).
func Open(dir string) (*Queue, error) { return open(dir, nil, false) }

// Create opens the queue in dir, creating it (and the directory) with opts when there is
// none; opts may be nil for the defaults. An existing queue keeps its stored settings.
func Create(dir string, opts *Options) (*Queue, error) { return open(dir, opts, true) }

func open(dir string, opts *Options, create bool) (*Queue, error) {
	var o C.spool_options
	C.spool_options_init_size(&o, C.sizeof_spool_options)
	if create {
		o.create = 1
	} else {
		o.create = 0
	}
	if opts != nil {
		if opts.Visibility > 0 {
			o.visibility_ms = ms(opts.Visibility)
		}
		if opts.MaxReceives > 0 {
			o.max_receives = C.uint32_t(opts.MaxReceives)
		} else if opts.MaxReceives < 0 {
			o.max_receives = 0
		}
		switch opts.Sync {
		case SyncAlways:
			o.sync = C.SPOOL_SYNC_ALWAYS
		case SyncInterval:
			o.sync = C.SPOOL_SYNC_INTERVAL
		case SyncNever:
			o.sync = C.SPOOL_SYNC_NEVER
		}
		if opts.SyncInterval > 0 {
			o.sync_interval_ms = ms(opts.SyncInterval)
		}
		if opts.SegmentSize > 0 {
			o.segment_size = C.uint64_t(opts.SegmentSize)
		}
		o.max_payload = C.uint64_t(opts.MaxPayload)
		o.retention_max_age_ms = ms(opts.RetentionMaxAge)
		o.retention_max_bytes = C.uint64_t(opts.RetentionMaxBytes)
		o.max_ready = C.uint64_t(opts.MaxReady)
		o.max_bytes = C.uint64_t(opts.MaxBytes)
		if opts.DedupWindow > 0 {
			o.dedup_window_ms = ms(opts.DedupWindow)
		}
		o.keep_acked_ms = ms(opts.KeepAcked)
	}
	cdir := C.CString(dir)
	defer C.free(unsafe.Pointer(cdir))
	var h *C.spool_queue
	runtime.LockOSThread()
	rc := C.spool_open(cdir, &o, &h)
	err := lastError(rc)
	runtime.UnlockOSThread()
	if err != nil {
		return nil, err
	}
	return &Queue{h: h}, nil
}

// Close closes the queue: leases bound to it (BindLeases) return to ready. It waits for
// calls under way (a long poll stops at its next slice, within 100 ms); later calls fail
// with ErrClosed. Idempotent.
func (q *Queue) Close() error {
	q.closed.Store(true)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.h != nil {
		C.spool_close(q.h)
		q.h = nil
	}
	return nil
}

// acquire takes the shared lock for one call; release with q.mu.RUnlock.
func (q *Queue) acquire() (*C.spool_queue, error) {
	q.mu.RLock()
	if q.h == nil {
		q.mu.RUnlock()
		return nil, ErrClosed
	}
	return q.h, nil
}

// BindLeases binds the leases this Queue takes from now on to this process: if the process
// dies, they return to ready at once instead of after their visibility.
func (q *Queue) BindLeases() error {
	h, err := q.acquire()
	if err != nil {
		return err
	}
	defer q.mu.RUnlock()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return lastError(C.spool_bind_leases(h))
}

// sendOptions builds the C send options of opts (nil for none) and the C block they point
// into, to free after the call (free of nil is a no-op).
func sendOptions(opts []SendOption, single bool) (*C.spool_send_options, unsafe.Pointer, error) {
	if len(opts) == 0 {
		return nil, nil, nil
	}
	var cfg sendConfig
	for _, o := range opts {
		o(&cfg)
	}
	so := new(C.spool_send_options)
	block, err := cfg.fill(so, single)
	return so, block, err
}

// Send appends one message and returns its id (ids increase). ctx is checked before the
// call; a send blocks only for a sync (WithSync) or a back-pressure wait (WithWaitForRoom).
func (q *Queue) Send(ctx context.Context, payload []byte, opts ...SendOption) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	sop, block, err := sendOptions(opts, true)
	if err != nil {
		return 0, err
	}
	if block != nil {
		defer C.free(block)
	}
	h, err := q.acquire()
	if err != nil {
		return 0, err
	}
	defer q.mu.RUnlock()
	var p unsafe.Pointer
	if len(payload) > 0 {
		p = unsafe.Pointer(&payload[0])
	}
	var id C.uint64_t
	runtime.LockOSThread()
	rc := C.spool_send(h, p, C.size_t(len(payload)), sop, &id)
	err = lastError(rc)
	runtime.UnlockOSThread()
	if err != nil {
		return 0, err
	}
	return uint64(id), nil
}

// SendBatch appends every payload, all or nothing, with consecutive ids. Options apply to
// every message (WithDedupID is refused: a batch cannot share one).
func (q *Queue) SendBatch(ctx context.Context, payloads [][]byte, opts ...SendOption) ([]uint64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	n := len(payloads)
	if n == 0 {
		return nil, nil
	}
	sop, opblock, err := sendOptions(opts, false)
	if err != nil {
		return nil, err
	}
	if opblock != nil {
		defer C.free(opblock)
	}
	// The C call takes an array of pointers; Go memory may not hold Go pointers handed to C,
	// so the pointers, lengths and bytes go into one C block.
	total := 0
	for _, p := range payloads {
		total += len(p)
	}
	ptrSize := int(unsafe.Sizeof(uintptr(0)))
	block := C.malloc(C.size_t(n*ptrSize + n*int(unsafe.Sizeof(C.size_t(0))) + total + 1))
	if block == nil {
		return nil, &Error{Code: CodeIO, Message: "out of memory"}
	}
	defer C.free(block)
	ptrs := unsafe.Slice((*unsafe.Pointer)(block), n)
	lens := unsafe.Slice((*C.size_t)(unsafe.Add(block, n*ptrSize)), n)
	data := unsafe.Add(block, n*ptrSize+n*int(unsafe.Sizeof(C.size_t(0))))
	bytes := unsafe.Slice((*byte)(data), total+1)
	off := 0
	for i, p := range payloads {
		copy(bytes[off:], p)
		ptrs[i] = unsafe.Add(data, off)
		lens[i] = C.size_t(len(p))
		off += len(p)
	}
	ids := make([]C.uint64_t, n)
	h, err := q.acquire()
	if err != nil {
		return nil, err
	}
	defer q.mu.RUnlock()
	runtime.LockOSThread()
	rc := C.spool_send_batch(h, (*unsafe.Pointer)(block), &lens[0], C.size_t(n), sop, &ids[0])
	err = lastError(rc)
	runtime.UnlockOSThread()
	if err != nil {
		return nil, err
	}
	out := make([]uint64, n)
	for i, id := range ids {
		out[i] = uint64(id)
	}
	return out, nil
}

// Receive leases up to max messages for visibility (0: the queue's default). With wait > 0
// it sleeps until a message is receivable (woken at once by a send from any process) or
// wait passes, then returns ErrEmpty; a cancelled ctx ends it within 100 ms with ctx.Err(),
// a Close with ErrClosed.
func (q *Queue) Receive(ctx context.Context, max int, visibility, wait time.Duration) ([]*Message, error) {
	if max <= 0 {
		return nil, &Error{Code: CodeInvalidArgument, Message: "invalid argument: max must be at least 1"}
	}
	deadline := time.Now().Add(wait)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if q.closed.Load() {
			return nil, ErrClosed
		}
		slice := time.Until(deadline)
		if slice > pollSlice {
			slice = pollSlice
		}
		msgs, err := q.receiveOnce(max, visibility, slice)
		if err != ErrEmpty || slice <= 0 || !time.Now().Before(deadline) {
			return msgs, err
		}
	}
}

func (q *Queue) receiveOnce(max int, visibility, wait time.Duration) ([]*Message, error) {
	h, err := q.acquire()
	if err != nil {
		return nil, err
	}
	defer q.mu.RUnlock()
	var msgs *C.spool_message
	var count C.size_t
	runtime.LockOSThread()
	rc := C.spool_receive(h, C.size_t(max), ms(visibility), ms(wait), &msgs, &count)
	err = lastError(rc)
	runtime.UnlockOSThread()
	if err != nil {
		return nil, err
	}
	defer C.spool_messages_free(msgs)
	return q.copyMessages(msgs, int(count)), nil
}

// copyMessages copies a batch out of the library's memory (freed by the caller right after).
func (q *Queue) copyMessages(msgs *C.spool_message, n int) []*Message {
	batch := unsafe.Slice(msgs, n)
	out := make([]*Message, n)
	for i := range batch {
		c := &batch[i]
		rlen := C.strlen(c.receipt)
		m := &Message{
			ID:           uint64(c.id),
			Payload:      C.GoBytes(c.payload, C.int(c.payload_len)),
			ReceiveCount: int(c.receive_count),
			Enqueued:     time.Unix(0, int64(c.enqueued_ns)),
			Priority:     C.SPOOL_DEFAULT_PRIORITY,
			receipt:      C.GoBytes(unsafe.Pointer(c.receipt), C.int(rlen+1)),
			q:            q,
		}
		var prio C.int
		if C.spool_message_priority(msgs, C.size_t(i), &prio) == C.SPOOL_OK {
			m.Priority = int(prio)
		}
		var group unsafe.Pointer
		var glen C.size_t
		if C.spool_message_group(msgs, C.size_t(i), &group, &glen) == C.SPOOL_OK && group != nil {
			m.Group = C.GoBytes(group, C.int(glen))
		}
		var attrs *C.spool_attribute
		var acount C.size_t
		if C.spool_message_attributes(msgs, C.size_t(i), &attrs, &acount) == C.SPOOL_OK && acount > 0 {
			m.Attributes = make(map[string][]byte, int(acount))
			for _, a := range unsafe.Slice(attrs, int(acount)) {
				m.Attributes[C.GoString(a.key)] = C.GoBytes(a.value, C.int(a.value_len))
			}
		}
		out[i] = m
	}
	return out
}

// settle runs one of ack / nack / extend on a receipt.
func (q *Queue) settle(kind int, receipt []byte, arg C.uint64_t) error {
	h, err := q.acquire()
	if err != nil {
		return err
	}
	defer q.mu.RUnlock()
	r := (*C.char)(unsafe.Pointer(&receipt[0]))
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	switch kind {
	case settleAck:
		return lastError(C.spool_ack(h, r, C.int(arg)))
	case settleNack:
		return lastError(C.spool_nack(h, r, arg))
	default:
		return lastError(C.spool_extend(h, r, arg))
	}
}

// AckBatch acks many receipts (Message.Receipt) at once, as SQS's DeleteMessageBatch: one
// append under one lock. It returns one error per receipt, in order: nil if that receipt was
// acked, else what Ack would have returned for it (ErrLeaseLost; ErrNotFound, also for a
// receipt given twice; ErrInvalidArgument for a malformed one). The second result is set
// only when the call failed as a whole, acking nothing (ErrReadOnly, ErrIO, ErrClosed...);
// the slice is then nil.
func (q *Queue) AckBatch(receipts []string) ([]error, error) {
	return q.ackBatch(receipts, C.SPOOL_DURABILITY_QUEUE)
}

// AckBatchSync is AckBatch that returns only once the acks are on disk (one sync for all),
// whatever the queue's policy.
func (q *Queue) AckBatchSync(receipts []string) ([]error, error) {
	return q.ackBatch(receipts, C.SPOOL_DURABILITY_SYNC)
}

func (q *Queue) ackBatch(receipts []string, durability C.int) ([]error, error) {
	n := len(receipts)
	// The C call takes an array of C strings; the pointers and bytes go into one C block (Go
	// memory handed to C may not hold Go pointers).
	total := 0
	for i, r := range receipts {
		if strings.IndexByte(r, 0) >= 0 { // C would read it cut short: another receipt
			return nil, &Error{Code: CodeInvalidArgument,
				Message: fmt.Sprintf("invalid argument: receipt %d contains a NUL byte: %q", i, r)}
		}
		total += len(r) + 1
	}
	ptrSize := int(unsafe.Sizeof(uintptr(0)))
	block := C.malloc(C.size_t(n*ptrSize + total + 1))
	if block == nil {
		return nil, &Error{Code: CodeIO, Message: "out of memory"}
	}
	defer C.free(block)
	ptrs := unsafe.Slice((**C.char)(block), n)
	data := unsafe.Add(block, n*ptrSize)
	bytes := unsafe.Slice((*byte)(data), total+1)
	off := 0
	for i, r := range receipts {
		copy(bytes[off:], r)
		bytes[off+len(r)] = 0
		ptrs[i] = (*C.char)(unsafe.Add(data, off))
		off += len(r) + 1
	}
	results := make([]C.spool_code, n+1) // +1: a valid &results[0] for an empty batch
	h, err := q.acquire()
	if err != nil {
		return nil, err
	}
	defer q.mu.RUnlock()
	runtime.LockOSThread()
	rc := C.spool_ack_batch(h, (**C.char)(block), C.size_t(n), durability, &results[0])
	switch rc {
	case C.SPOOL_OK, C.SPOOL_LEASE_LOST, C.SPOOL_NOT_FOUND, C.SPOOL_INVALID_ARGUMENT:
		// a receipt's own codes: the call went through and results[] has each outcome
	default:
		err = lastError(rc)
	}
	runtime.UnlockOSThread()
	if err != nil {
		return nil, err
	}
	out := make([]error, n)
	for i, c := range results[:n] {
		if c != C.SPOOL_OK {
			out[i] = &Error{Code: Code(c), Message: fmt.Sprintf("receipt %q: %s", receipts[i], Code(c))}
		}
	}
	return out, nil
}

const (
	settleAck = iota
	settleNack
	settleExtend
)

// Stats are a queue's counters (docs/semantics.md, "Stats").
type Stats struct {
	Ready, InFlight, Delayed, Dead, Blocked  uint64
	OldestReadyAge                           time.Duration
	SentTotal, AckedTotal, DeadLetteredTotal uint64
	ExpiredTotal, NackedTotal                uint64
	Bytes, BytesOnDisk, Segments, NextID     uint64
	DedupIDs, KeptAcked, KeptAckedBytes      uint64
}

// Stats reads the queue's counters.
func (q *Queue) Stats() (Stats, error) {
	h, err := q.acquire()
	if err != nil {
		return Stats{}, err
	}
	defer q.mu.RUnlock()
	var s C.spool_stats
	s.size = C.sizeof_spool_stats
	runtime.LockOSThread()
	err = lastError(C.spool_get_stats(h, &s))
	runtime.UnlockOSThread()
	if err != nil {
		return Stats{}, err
	}
	return Stats{
		Ready: uint64(s.ready), InFlight: uint64(s.in_flight), Delayed: uint64(s.delayed),
		Dead: uint64(s.dead), Blocked: uint64(s.blocked),
		OldestReadyAge: time.Duration(float64(s.oldest_ready_age_s) * float64(time.Second)),
		SentTotal:      uint64(s.sent_total), AckedTotal: uint64(s.acked_total),
		DeadLetteredTotal: uint64(s.dead_lettered_total), ExpiredTotal: uint64(s.expired_total),
		NackedTotal: uint64(s.nacked_total), Bytes: uint64(s.bytes),
		BytesOnDisk: uint64(s.bytes_on_disk), Segments: uint64(s.segments),
		NextID: uint64(s.next_id), DedupIDs: uint64(s.dedup_ids), KeptAcked: uint64(s.kept_acked),
		KeptAckedBytes: uint64(s.kept_acked_bytes),
	}, nil
}

// Purge removes every message and returns how many.
func (q *Queue) Purge() (uint64, error) {
	h, err := q.acquire()
	if err != nil {
		return 0, err
	}
	defer q.mu.RUnlock()
	var n C.uint64_t
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := lastError(C.spool_purge(h, &n)); err != nil {
		return 0, err
	}
	return uint64(n), nil
}
