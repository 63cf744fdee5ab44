package spool

// #include <spool/spool.h>
import "C"

import "errors"

// Code is a result code of the C API (spool_code); its numbers are stable across releases.
type Code int

// The codes of include/spool/spool.h.
const (
	CodeOK              Code = C.SPOOL_OK
	CodeEmpty           Code = C.SPOOL_EMPTY
	CodeLeaseLost       Code = C.SPOOL_LEASE_LOST
	CodeNotFound        Code = C.SPOOL_NOT_FOUND
	CodeInvalidArgument Code = C.SPOOL_INVALID_ARGUMENT
	CodeTooLarge        Code = C.SPOOL_TOO_LARGE
	CodeQueueFull       Code = C.SPOOL_QUEUE_FULL
	CodeNotAQueue       Code = C.SPOOL_NOT_A_QUEUE
	CodeIncompatible    Code = C.SPOOL_INCOMPATIBLE
	CodeNoSpace         Code = C.SPOOL_NO_SPACE
	CodeIO              Code = C.SPOOL_IO
	CodeCorrupt         Code = C.SPOOL_CORRUPT
	CodeReadOnly        Code = C.SPOOL_READ_ONLY
)

// String is the code's short stable name ("lease lost").
func (c Code) String() string { return C.GoString(C.spool_code_name(C.int(c))) }

// Error is a failed call: its Code and the library's message, which names what is wrong
// and, where a user can act, what to do. errors.Is(err, ErrLeaseLost) and the like match
// by code; errors.As(err, &e) gives the message's details.
type Error struct {
	Code    Code
	Message string // "" for the sentinels below
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "spool: " + e.Code.String()
	}
	return "spool: " + e.Message
}

// Is matches a sentinel (an *Error without a message) of the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Code == e.Code
}

// Sentinels for errors.Is, one per code.
var (
	// ErrEmpty: Receive found nothing before its wait ran out.
	ErrEmpty = &Error{Code: CodeEmpty}
	// ErrLeaseLost: the lease expired and the message was received again; nothing changed.
	// Drop the result of the work: another consumer is doing it.
	ErrLeaseLost = &Error{Code: CodeLeaseLost}
	// ErrNotFound: unknown or already-acked message or receipt.
	ErrNotFound = &Error{Code: CodeNotFound}
	// ErrInvalidArgument: a malformed receipt, option or input.
	ErrInvalidArgument = &Error{Code: CodeInvalidArgument}
	// ErrTooLarge: the payload is over the queue's max payload.
	ErrTooLarge = &Error{Code: CodeTooLarge}
	// ErrQueueFull: a back-pressure limit (MaxReady, MaxBytes) was reached.
	ErrQueueFull = &Error{Code: CodeQueueFull}
	// ErrNotAQueue: the directory is not a spool queue (or does not exist, for Open).
	ErrNotAQueue = &Error{Code: CodeNotAQueue}
	// ErrIncompatible: a newer on-disk format, or an index of an incompatible build.
	ErrIncompatible = &Error{Code: CodeIncompatible}
	// ErrNoSpace: the disk is full; free space, then retry (receive and ack keep working).
	ErrNoSpace = &Error{Code: CodeNoSpace}
	// ErrIO: any other I/O error (the message has the errno text).
	ErrIO = &Error{Code: CodeIO}
	// ErrCorrupt: a checksum or structure failure in stored data.
	ErrCorrupt = &Error{Code: CodeCorrupt}
	// ErrReadOnly: this process may not change the queue (only Stats works).
	ErrReadOnly = &Error{Code: CodeReadOnly}
	// ErrClosed: the Queue was closed (a binding error, not a C API code).
	ErrClosed = errors.New("spool: the queue is closed")
)
