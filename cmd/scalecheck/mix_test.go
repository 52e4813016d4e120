package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"testing"
	"time"
)

// TestMixShort is -mix cold's short run: 2 replicas, 400 users (40
// requests a second) and the pushers, the in-flight cap's MaxDuration 1 s
// so that its shares spend after 36 s of warm-up, 8 s measured with a
// replica killed and another joining. Judged by the clients' own ledger:
// no limit exceeded (the user at 150 % of the rate within burst + rate ×
// L in every interval, the token at 150 % of the in-flight cap never more
// than 8 at once), no decision failed; and the JSON report has every
// field, with the limits' server CPU and statements per request measured.
// (The figures themselves are the full run's, make scalecheck-mix: a
// loaded CI machine decides them more than the mix does.)
func TestMixShort(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute of load")
	}
	c := mixConfig{Replicas: 2, Users: 400, Warmup: 37 * time.Second, Duration: 8 * time.Second, MaxRequest: time.Second,
		JSON: true, Kill: true, Pushers: true}
	var out bytes.Buffer
	code, err := runMix(context.Background(), c, &out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var rep mixReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("the report is not JSON: %v\n%s", err, out.Bytes())
	}
	t.Logf("exit %d\n%s", code, out.Bytes())
	if len(rep.Exceeded) > 0 {
		t.Errorf("exceeded: %v", rep.Exceeded)
	}
	if rep.Errors > 0 {
		t.Errorf("%d decisions failed", rep.Errors)
	}
	if rep.Requests == 0 || rep.ServerCPUUsPerRequest <= 0 || rep.StatementsPerRequest <= 0 || rep.Judged == 0 || len(rep.Highest) != 3 {
		t.Errorf("a report without its measures: %+v", rep)
	}
}
