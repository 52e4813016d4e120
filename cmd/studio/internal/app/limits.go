package app

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/db"
)

type limitRow struct {
	Scope     string    `json:"scope"`
	Slot      int32     `json:"slot"`
	Holder    string    `json:"holder"`
	Endpoint  string    `json:"endpoint"`
	Replica   string    `json:"replica"`
	ClaimedAt time.Time `json:"claimedAt"`
	ExpiresAt time.Time `json:"expiresAt"`
	// TokenName and User name the token of an in-flight row (its holder
	// is the token's id; the token itself is never stored).
	TokenName string `json:"tokenName,omitempty"`
	User      string `json:"user,omitempty"`
}

type throttleRow struct {
	Key string `json:"key"`
	// Scope is what the key counts: "username" or "address" (the service
	// keys each throttle with its scope's prefix).
	Scope     string    `json:"scope"`
	Failures  int32     `json:"failures"`
	FirstAt   time.Time `json:"firstAt"`
	LastAt    time.Time `json:"lastAt"`
	ExpiresAt time.Time `json:"expiresAt"`
}

// banRow is a key banned (-ban-after): until when, and since when.
type banRow struct {
	Key   string    `json:"key"`
	Since time.Time `json:"since"`
	Until time.Time `json:"until"`
}

type replicaRow struct {
	Name        string    `json:"name"`
	StartedAt   time.Time `json:"startedAt"`
	HeartbeatAt time.Time `json:"heartbeatAt"`
	Ready       bool      `json:"ready"`
	ExpiresAt   time.Time `json:"expiresAt"`
}

// refusalsJSON are the installation's refusals per limit and minute.
type refusalsJSON struct {
	// Minutes are the last 15 minutes of the database clock, oldest first.
	Minutes []time.Time         `json:"minutes"`
	Limits  []limitRefusalsJSON `json:"limits"`
}

type limitRefusalsJSON struct {
	Name          string  `json:"name"`
	Refused       []int64 `json:"refused"`
	DryRunRefused []int64 `json:"dryRunRefused"`
}

type limitsResponse struct {
	Permits       []limitRow    `json:"permits"`
	Throttles     []throttleRow `json:"throttles"`
	UploadWindows []limitRow    `json:"uploadWindows"`
	InFlight      []limitRow    `json:"inFlight"`
	Bans          []banRow      `json:"bans"`
	// Overrides are the keys' own limits (at most listMax), by policy and
	// key.
	Overrides       []overrideJSON `json:"overrides"`
	Replicas        []replicaRow   `json:"replicas"`
	ReadyReplicas   int            `json:"readyReplicas"`
	InstallationCap int            `json:"installationCap"`
	// ReadReplica is whether the read replica answers its health check
	// (history reads go to it while it does); null without one.
	ReadReplica *bool `json:"readReplicaHealthy"`
	// Refusals are every limit's refusals per minute over the last 15
	// minutes, counted by all replicas (pglimit.Refusals).
	Refusals refusalsJSON `json:"refusals"`
	// DryRun are the limits this replica runs in dry run (-dry-run).
	DryRun []string `json:"dryRun"`
	// Replica is the replica that answered.
	Replica string `json:"replica"`
	// ListMax bounds each list above (permits, throttles, upload windows,
	// in flight, bans): at most this many rows, the latest to lapse first.
	ListMax int `json:"listMax"`
	// Totals are how many rows each bounded list has in all.
	Totals listTotals `json:"totals"`
	// Console is what a console statement runs with (temp_file_limit,
	// work_mem, parallel workers) and what of its settings it runs without,
	// and why, as this replica read it at start-up.
	Console *consoleResourcesJSON `json:"console"`
}

// listTotals count every live row of each bounded list of the operator
// view; a list shows at most listMax of them.
type listTotals struct {
	Permits       int64 `json:"permits"`
	Throttles     int64 `json:"throttles"`
	UploadWindows int64 `json:"uploadWindows"`
	InFlight      int64 `json:"inFlight"`
	Bans          int64 `json:"bans"`
}

// listMax is how many rows each list of the operator view holds at most:
// anyone may add throttle rows (a failed sign-in) and every user in-flight
// and upload rows, so no list may grow with them.
const listMax = 100

// refusalMinutes is the span of the refusal chart.
const refusalMinutes = 15

// readLimits reads what every limit holds now, the replica registry and
// the refusals of the last 15 minutes. It always reads the primary:
// UNLOGGED tables are not replicated.
func (a *App) readLimits(ctx context.Context) (*limitsResponse, error) {
	resp := &limitsResponse{
		Permits: []limitRow{}, Throttles: []throttleRow{}, UploadWindows: []limitRow{}, InFlight: []limitRow{}, Bans: []banRow{}, Replicas: []replicaRow{},
		InstallationCap: a.installationCap(), DryRun: []string{}, Replica: a.cfg.ReplicaName,
		Console: a.consoleRes.json(),
	}
	for _, n := range LimitNames {
		if a.cfg.DryRun[n] {
			resp.DryRun = append(resp.DryRun, n)
		}
	}
	if a.replica != nil {
		healthy := a.router.Healthy()
		resp.ReadReplica = &healthy
	}
	resp.ListMax = listMax
	for _, kind := range []struct {
		kind  string
		into  *[]limitRow
		total *int64
	}{
		// The kinds of rows of pglimit.slot (sql/schema): the heavy
		// permits', the upload windows', the in-flight cap's.
		{"heavy_permit", &resp.Permits, &resp.Totals.Permits},
		{"upload_window", &resp.UploadWindows, &resp.Totals.UploadWindows},
		{"request_in_flight", &resp.InFlight, &resp.Totals.InFlight},
	} {
		held, err := db.New().SlotListFirst(ctx, a.primary, &db.SlotListFirstParams{Kind: string(kind.kind), Max: listMax})
		if err != nil {
			return nil, err
		}
		if *kind.total, err = db.New().SlotCount(ctx, a.primary, string(kind.kind)); err != nil {
			return nil, err
		}
		// Counted after the list: a row claimed between the two never
		// makes the total smaller than the list.
		*kind.total = max(*kind.total, int64(len(held)))
		for _, h := range held {
			*kind.into = append(*kind.into, limitRow{Scope: h.Scope, Slot: h.Slot, Holder: h.Holder, Endpoint: h.Endpoint,
				Replica: h.Replica, ClaimedAt: h.ClaimedAt, ExpiresAt: h.ExpiresAt})
		}
	}
	if err := a.nameTokens(ctx, resp.InFlight); err != nil {
		return nil, err
	}
	throttles, err := db.New().LoginAttemptList(ctx, a.primary, listMax)
	if err != nil {
		return nil, err
	}
	if resp.Totals.Throttles, err = db.New().LoginAttemptCount(ctx, a.primary); err != nil {
		return nil, err
	}
	resp.Totals.Throttles = max(resp.Totals.Throttles, int64(len(throttles)))
	for _, t := range throttles {
		resp.Throttles = append(resp.Throttles, throttleRow{Key: t.Key, Scope: throttleScope(t.Key), Failures: t.Failures, FirstAt: t.FirstAt, LastAt: t.LastAt, ExpiresAt: t.ExpiresAt})
	}
	bans, err := db.New().BanList(ctx, a.primary, listMax)
	if err != nil {
		return nil, err
	}
	if resp.Totals.Bans, err = db.New().BanCount(ctx, a.primary); err != nil {
		return nil, err
	}
	resp.Totals.Bans = max(resp.Totals.Bans, int64(len(bans)))
	for _, b := range bans {
		resp.Bans = append(resp.Bans, banRow{Key: b.Key, Since: b.BannedAt, Until: b.Until})
	}
	if resp.Overrides, err = a.listOverrides(ctx, listMax); err != nil {
		return nil, err
	}
	replicas, err := a.listReplicas(ctx)
	if err != nil {
		return nil, err
	}
	for _, rep := range replicas {
		resp.Replicas = append(resp.Replicas, rep)
		if rep.Ready {
			resp.ReadyReplicas++
		}
	}
	resp.ReadyReplicas = max(resp.ReadyReplicas, 1)
	refusals, err := pglimit.Refusals(ctx, a.primary, refusalMinutes)
	if err != nil {
		return nil, err
	}
	resp.Refusals = refusalsJSON{Minutes: refusals.Minutes, Limits: []limitRefusalsJSON{}}
	for _, name := range slices.Sorted(maps.Keys(refusals.Refused)) {
		resp.Refusals.Limits = append(resp.Refusals.Limits, limitRefusalsJSON{Name: name,
			Refused: refusals.Refused[name], DryRunRefused: refusals.DryRunRefused[name]})
	}
	return resp, nil
}

// listReplicas reads every row of pglimit's replica registry, ready or
// not, by name: the operator's view of the replicas (the registry itself
// only counts the ready ones).
func (a *App) listReplicas(ctx context.Context) ([]replicaRow, error) {
	rows, err := a.primary.Query(ctx, `SELECT name, started_at, heartbeat_at, ready AND expires_at > now(), expires_at
		FROM pglimit.replica ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("replicas: %w", err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (replicaRow, error) {
		var r replicaRow
		err := row.Scan(&r.Name, &r.StartedAt, &r.HeartbeatAt, &r.Ready, &r.ExpiresAt)
		return r, err
	})
}

// nameTokens fills in the token name and user of in-flight rows, whose
// holder is the token's id (tokenOf).
func (a *App) nameTokens(ctx context.Context, rows []limitRow) error {
	var ids []int64
	for _, r := range rows {
		if id, err := strconv.ParseInt(r.Holder, 10, 64); err == nil && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil
	}
	names, err := a.q.ApiTokenNames(ctx, a.primary, ids)
	if err != nil {
		return err
	}
	for i := range rows {
		for _, n := range names {
			if strconv.FormatInt(n.ID, 10) == rows[i].Holder {
				rows[i].TokenName, rows[i].User = n.Name, n.Username
			}
		}
	}
	return nil
}

// handleLimits is the operator view (GET /api/limits, operators only):
// the live permits, throttles, upload windows, in-flight rows and bans, as plain
// rows of the limit tables, at most listMax of each (the latest to lapse
// first) with the count of each in totals, the replica registry, and every limit's
// refusals per minute over the last 15 minutes. readReplicaHealthy says
// whether the read replica (-read-replica-url) serves history reads now;
// null without one.
func (a *App) handleLimits(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := listingContext(r.Context())
	defer cancel()
	resp, err := a.readLimits(ctx)
	if err != nil {
		a.dbError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// throttleScope is the scope of a sign-in throttle's key: "address" for
// the client address's, "username" for the username's.
func throttleScope(key string) string {
	if strings.HasPrefix(key, "address:") {
		return "address"
	}
	return "username"
}
