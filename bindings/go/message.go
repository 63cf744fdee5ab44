package spool

// #include <spool/spool.h>
import "C"

import "time"

// Message is one delivery, copied out of the queue: it stays valid after Ack.
type Message struct {
	ID           uint64
	Payload      []byte
	ReceiveCount int       // 1 on the first delivery
	Enqueued     time.Time // when it was sent
	Priority     int       // 0 (most urgent) to 255; 128 when sent without one
	Group        []byte    // its ordered group; nil for none
	Attributes   map[string][]byte

	receipt []byte // NUL-terminated: names this delivery's lease
	q       *Queue
}

// Receipt names this delivery's lease (another process may settle it with the CLI).
func (m *Message) Receipt() string { return string(m.receipt[:len(m.receipt)-1]) }

// Ack deletes the message. ErrLeaseLost if its lease expired and it was received again
// (nothing changed), ErrNotFound if it is already gone.
func (m *Message) Ack() error { return m.q.settle(settleAck, m.receipt, C.SPOOL_DURABILITY_QUEUE) }

// AckSync is Ack that returns only once the ack is on disk, whatever the queue's policy.
func (m *Message) AckSync() error {
	return m.q.settle(settleAck, m.receipt, C.SPOOL_DURABILITY_SYNC)
}

// Nack makes the message receivable again after delay (0: at once). Errors as Ack.
func (m *Message) Nack(delay time.Duration) error {
	return m.q.settle(settleNack, m.receipt, ms(delay))
}

// Extend renews the lease to end d from now (a heartbeat for long work). Errors as Ack.
func (m *Message) Extend(d time.Duration) error {
	return m.q.settle(settleExtend, m.receipt, ms(d))
}
