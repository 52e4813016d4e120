package fakenode_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/pglimit/pglimit/cmd/internal/fakenode"
)

// TestKernelStamps: a call is stamped with the time the kernel received
// it, not the time the node got to it. The calls are sent, one at a time
// on one kept-alive connection, while the node is not yet serving (as a
// node starved of CPU): each call's At lies within the write that sent it,
// before the node began to serve, and Handled after.
func TestKernelStamps(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("the kernel's stamps are read on Linux only")
	}
	n, err := fakenode.New(fakenode.Options{Queues: 1})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := fakenode.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: n, ConnContext: fakenode.ConnContext}
	t.Cleanup(func() { _ = srv.Close() })
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	body := `[{"type":"search","mbean":"org.apache.activemq.artemis:queue=*"}]`
	req := fmt.Sprintf("POST /jolokia/ HTTP/1.1\r\nHost: node\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	send := func() (before, after time.Time) {
		before = time.Now()
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		return before, time.Now()
	}
	answer := func() {
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("status %d", res.StatusCode)
		}
	}
	sent1, wrote1 := send()
	time.Sleep(300 * time.Millisecond) // the node does not serve yet
	served := time.Now()
	go func() { _ = srv.Serve(ln) }()
	answer()
	time.Sleep(100 * time.Millisecond)
	sent2, wrote2 := send()
	answer()

	calls := n.Calls()
	if len(calls) != 2 {
		t.Fatalf("%d calls, want 2", len(calls))
	}
	for i, w := range [][2]time.Time{{sent1, wrote1}, {sent2, wrote2}} {
		got := calls[i]
		t.Logf("call %d: sent %s..%s, stamped %s (kernel %v), handled %s", i+1,
			w[0].Format("15:04:05.000000"), w[1].Format("15:04:05.000000"), got.At.Format("15:04:05.000000"), got.Stamped, got.Handled.Format("15:04:05.000000"))
		if !got.Stamped {
			t.Errorf("call %d: not stamped by the kernel", i+1)
		}
		if got.At.Before(w[0]) || got.At.After(w[1]) {
			t.Errorf("call %d: stamped %v, outside its write %v..%v", i+1, got.At, w[0], w[1])
		}
	}
	if !calls[0].At.Before(served) || calls[0].Handled.Before(served) {
		t.Errorf("the first call was stamped %v and handled %v; the node began to serve at %v", calls[0].At, calls[0].Handled, served)
	}
	if st := n.Stats(); st.Calls != 2 {
		t.Errorf("stats %+v", st)
	}
}
