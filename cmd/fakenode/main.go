// Command fakenode serves a stand-in broker node that speaks the Jolokia
// subset of package cmd/internal/jolokia over N queues, and reports the calls
// it receives: GET /stats answers them as JSON (total, by kind, per second),
// and -report prints a line every second.
//
//	go run ./cmd/fakenode -addr 127.0.0.1:8161 -queues 450
//	go run ./cmd/studio -node fake=http://127.0.0.1:8161
//
// It is for demos, tests and load checks, not a broker.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/pglimit/pglimit/cmd/internal/fakenode"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8161", "listen address")
	queues := flag.Int("queues", 10, "number of queues, q1..qN")
	broker := flag.String("broker", "fake", "broker name in the MBean names")
	delay := flag.Duration("delay", 0, "delay before every answer (a slow node)")
	report := flag.Bool("report", true, "print the calls received every second")
	flag.Parse()
	if err := run(*addr, *queues, *broker, *delay, *report); err != nil {
		fmt.Fprintln(os.Stderr, "fakenode:", err)
		os.Exit(1)
	}
}

func run(addr string, queues int, broker string, delay time.Duration, report bool) error {
	node, err := fakenode.New(fakenode.Options{Queues: queues, Broker: broker, Delay: delay})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: node, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log.Printf("%v: Jolokia at http://%s/jolokia/, stats at http://%s/stats", node, ln.Addr(), ln.Addr())
	if report {
		go func() {
			t := time.NewTicker(time.Second)
			defer t.Stop()
			var last int64
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					st := node.Stats()
					if st.Calls != last {
						log.Printf("%s", st.Summary())
						last = st.Calls
					}
				}
			}
		}()
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Printf("stopped: %s", node.Stats().Summary())
	return nil
}
