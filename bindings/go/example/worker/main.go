// Command worker is a spool worker in Go: it takes messages from a queue, handles each one
// and acks it, until SIGTERM or SIGINT (then it finishes the message in hand), or until the
// queue has been idle for -idle.
//
//	go run ./example/worker -work 10ms /var/spool/jobs
//
// Handling here is a stand-in: it prints "processing PAYLOAD", sleeps -work, acks, and
// prints "acked PAYLOAD". Its leases are bound to the process, so if it is killed the
// message in hand is ready again at once for another worker (Go, C, Python, `spool work`).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"spool"
)

func main() {
	work := flag.Duration("work", 0, "time to spend on each message")
	idle := flag.Duration("idle", 0, "exit after this long without a message (0: never)")
	visibility := flag.Duration("visibility", 30*time.Second, "lease of each message")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: worker [-work D] [-idle D] [-visibility D] QUEUE_DIR")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *work, *idle, *visibility); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func run(dir string, work, idle, visibility time.Duration) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	q, err := spool.Open(dir)
	if err != nil {
		return err
	}
	defer q.Close()
	if err := q.BindLeases(); err != nil {
		return err
	}
	lastWork := time.Now()
	for {
		msgs, err := q.Receive(ctx, 1, visibility, time.Second)
		switch {
		case errors.Is(err, spool.ErrEmpty):
			if idle > 0 && time.Since(lastWork) >= idle {
				return nil
			}
			continue
		case errors.Is(err, context.Canceled):
			return nil // stopped by a signal between messages
		case err != nil:
			return err
		}
		lastWork = time.Now()
		m := msgs[0]
		fmt.Printf("processing %s\n", m.Payload)
		time.Sleep(work)
		switch err := m.Ack(); {
		case errors.Is(err, spool.ErrLeaseLost):
			// The lease ran out and another worker has the message: drop this result.
			fmt.Printf("lost %s\n", m.Payload)
		case err != nil:
			return err
		default:
			fmt.Printf("acked %s\n", m.Payload)
		}
	}
}
