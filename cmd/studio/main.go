// Command studio is pglimit's reference service: a small broker console
// whose heavy endpoints, sign-in, uploads, API tokens and broker calls are
// limited across every replica by pglimit. See REFERENCE-SERVICE.md.
//
// With no -database-url (and no DATABASE_URL) it starts a throwaway
// PostgreSQL of its own from the server binaries installed on the machine,
// migrates it, seeds demo data and serves; the data is removed on exit.
// Several processes started with the same database URL and different -addr
// are replicas of one installation.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/pglimit/pglimit/cmd/studio/internal/app"
	"github.com/pglimit/pglimit/internal/harness/embedpg"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "studio:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	cfg, err := app.ParseFlags(args)
	if err != nil {
		return err
	}
	log := newLogger(cfg)
	slog.SetDefault(log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	embedded := cfg.DatabaseURL == ""
	if embedded {
		log.Info("no -database-url: starting an embedded PostgreSQL")
		startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		cluster, err := embedpg.Start(startCtx, embedpg.Options{})
		cancel()
		if err != nil {
			return fmt.Errorf("embedded PostgreSQL: %w", err)
		}
		defer func() {
			if err := cluster.Stop(); err != nil {
				log.Warn("embedded PostgreSQL did not stop cleanly", "err", err)
			}
		}()
		cfg.DatabaseURL = cluster.URL("postgres")
		log.Info("embedded PostgreSQL is up", "url", cfg.DatabaseURL)
	}

	initCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	a, err := app.New(initCtx, cfg, embedded, log)
	cancel()
	if err != nil {
		return err
	}
	defer a.Close()

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           a.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	bgCtx, bgCancel := context.WithCancel(context.Background())
	bgDone := make(chan error, 1)
	go func() { bgDone <- a.Run(bgCtx) }()

	serveErr := make(chan error, 1)
	// Each peer address holds at most -max-conns-per-peer connections
	// (trusted proxies excepted): the limits count requests, the listener
	// bounds connections.
	go func() { serveErr <- srv.Serve(a.Listener(ln)) }()
	log.Info("studio is serving", "addr", ln.Addr().String(), "replica", cfg.ReplicaName)

	var bgErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err := <-serveErr:
		bgCancel()
		return errors.Join(err, <-bgDone)
	case bgErr = <-bgDone:
		// The background work ended on its own: it failed, and the replica
		// cannot go on counting itself or sweeping. Shut down.
		if bgErr == nil {
			bgErr = errors.New("the background work ended before shutdown")
		}
		log.Error("background work failed; shutting down", "err", bgErr)
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	a.Drain(shutCtx)
	if err := srv.Shutdown(shutCtx); err != nil {
		log.Warn("shutdown", "err", err)
	}
	// No request runs any more: see every release on its way to the
	// database before the pools close.
	if err := a.Flush(shutCtx); err != nil {
		log.Warn("shutdown: releases not confirmed; their slots lapse on their own", "err", err)
	}
	// Background work stops last: the registry marks this replica not ready
	// and deletes its row once no request runs any more.
	bgCancel()
	if bgErr != nil {
		return bgErr
	}
	return <-bgDone
}

func newLogger(cfg *app.Config) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(strings.ToUpper(cfg.LogLevel)))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}
