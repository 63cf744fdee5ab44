package spool

// #include <stdlib.h>
// #include <spool/spool.h>
import "C"

import (
	"sort"
	"time"
	"unsafe"
)

// SendOption sets how Send and SendBatch queue a message.
type SendOption func(*sendConfig)

type sendConfig struct {
	delay, waitForRoom time.Duration
	sync               bool
	priority           int
	hasPriority        bool
	group, dedupID     []byte
	hasGroup, hasDedup bool
	attrs              map[string][]byte
}

// WithDelay makes the message receivable only after d.
func WithDelay(d time.Duration) SendOption { return func(c *sendConfig) { c.delay = d } }

// WithSync makes the call return only once the message is on disk.
func WithSync() SendOption { return func(c *sendConfig) { c.sync = true } }

// WithWaitForRoom waits up to d at a back-pressure limit before ErrQueueFull.
func WithWaitForRoom(d time.Duration) SendOption { return func(c *sendConfig) { c.waitForRoom = d } }

// WithPriority sets the priority: 0 is the most urgent, 255 the least, 128 the default.
func WithPriority(p int) SendOption {
	return func(c *sendConfig) { c.priority, c.hasPriority = p, true }
}

// WithGroup puts the message in an ordered group: a group's messages are received one at a
// time, in send order.
func WithGroup(g string) SendOption {
	return func(c *sendConfig) { c.group, c.hasGroup = []byte(g), true }
}

// WithDedupID deduplicates: a second send of id within the queue's dedup window queues
// nothing and returns the first message's id. Send only.
func WithDedupID(id string) SendOption {
	return func(c *sendConfig) { c.dedupID, c.hasDedup = []byte(id), true }
}

// WithAttribute sets one attribute (key: 1 to 64 of [A-Za-z0-9._-]; value: any bytes, up to
// 1024). At most 16 per message.
func WithAttribute(key string, value []byte) SendOption {
	return func(c *sendConfig) {
		if c.attrs == nil {
			c.attrs = map[string][]byte{}
		}
		c.attrs[key] = value
	}
}

// fill sets *so from c. Attributes, group and dedup id are copied into one C block (C may
// not be handed Go memory that points to Go memory), returned for the caller to free after
// the call; nil when there is none.
func (c *sendConfig) fill(so *C.spool_send_options, single bool) (unsafe.Pointer, error) {
	C.spool_send_options_init_size(so, C.sizeof_spool_send_options)
	so.delay_ms = ms(c.delay)
	so.wait_for_room_ms = ms(c.waitForRoom)
	if c.sync {
		so.durability = C.SPOOL_DURABILITY_SYNC
	}
	if c.hasPriority {
		so.has_priority = 1
		so.priority = C.int(c.priority)
	}
	if !c.hasGroup && !c.hasDedup && len(c.attrs) == 0 {
		return nil, nil
	}
	if c.hasDedup && !single {
		return nil, &Error{Code: CodeInvalidArgument,
			Message: "invalid argument: a batch cannot share one dedup id (send each message with its own)"}
	}
	keys := make([]string, 0, len(c.attrs))
	size := len(c.group) + len(c.dedupID) + 1
	for k, v := range c.attrs {
		keys = append(keys, k)
		size += len(k) + 1 + len(v)
	}
	sort.Strings(keys)
	attrSize := int(unsafe.Sizeof(C.spool_attribute{}))
	block := C.malloc(C.size_t(len(keys)*attrSize + size))
	if block == nil {
		return nil, &Error{Code: CodeIO, Message: "out of memory"}
	}
	attrs := unsafe.Slice((*C.spool_attribute)(block), len(keys))
	bytes := unsafe.Slice((*byte)(unsafe.Add(block, len(keys)*attrSize)), size)
	off := 0
	put := func(b []byte, nul bool) unsafe.Pointer {
		p := unsafe.Pointer(&bytes[off])
		off += copy(bytes[off:], b)
		if nul {
			bytes[off] = 0
			off++
		}
		return p
	}
	for i, k := range keys {
		attrs[i].key = (*C.char)(put([]byte(k), true))
		v := c.attrs[k]
		attrs[i].value = put(v, false)
		attrs[i].value_len = C.size_t(len(v))
	}
	if len(keys) > 0 {
		so.attributes = &attrs[0]
		so.attribute_count = C.size_t(len(keys))
	}
	if c.hasGroup {
		so.group = put(c.group, false)
		so.group_len = C.size_t(len(c.group))
	}
	if c.hasDedup {
		so.dedup_id = put(c.dedupID, false)
		so.dedup_id_len = C.size_t(len(c.dedupID))
	}
	return block, nil
}
