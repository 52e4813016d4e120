package app

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/permit"
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
	Key       string    `json:"key"`
	Failures  int32     `json:"failures"`
	FirstAt   time.Time `json:"firstAt"`
	LastAt    time.Time `json:"lastAt"`
	ExpiresAt time.Time `json:"expiresAt"`
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
	Permits         []limitRow    `json:"permits"`
	Throttles       []throttleRow `json:"throttles"`
	UploadWindows   []limitRow    `json:"uploadWindows"`
	InFlight        []limitRow    `json:"inFlight"`
	Replicas        []replicaRow  `json:"replicas"`
	ReadyReplicas   int           `json:"readyReplicas"`
	InstallationCap int           `json:"installationCap"`
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
}

// refusalMinutes is the span of the refusal chart.
const refusalMinutes = 15

// readLimits reads what every limit holds now, the replica registry and
// the refusals of the last 15 minutes. It always reads the primary:
// UNLOGGED tables are not replicated.
func (a *App) readLimits(ctx context.Context) (*limitsResponse, error) {
	resp := &limitsResponse{
		Permits: []limitRow{}, Throttles: []throttleRow{}, UploadWindows: []limitRow{}, InFlight: []limitRow{}, Replicas: []replicaRow{},
		InstallationCap: a.installationCap(), DryRun: []string{}, Replica: a.cfg.ReplicaName,
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
	for _, kind := range []struct {
		kind permit.Kind
		into *[]limitRow
	}{{permit.HeavyPermit, &resp.Permits}, {permit.UploadWindow, &resp.UploadWindows}, {permit.RequestInFlight, &resp.InFlight}} {
		held, err := db.New().SlotList(ctx, a.primary, string(kind.kind))
		if err != nil {
			return nil, err
		}
		for _, h := range held {
			*kind.into = append(*kind.into, limitRow{Scope: h.Scope, Slot: h.Slot, Holder: h.Holder, Endpoint: h.Endpoint,
				Replica: h.Replica, ClaimedAt: h.ClaimedAt, ExpiresAt: h.ExpiresAt})
		}
	}
	if err := a.nameTokens(ctx, resp.InFlight); err != nil {
		return nil, err
	}
	throttles, err := db.New().LoginAttemptList(ctx, a.primary)
	if err != nil {
		return nil, err
	}
	for _, t := range throttles {
		resp.Throttles = append(resp.Throttles, throttleRow{Key: t.Key, Failures: t.Failures, FirstAt: t.FirstAt, LastAt: t.LastAt, ExpiresAt: t.ExpiresAt})
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
// every live permit, throttle, upload window and in-flight row, as plain
// rows of the limit tables, the replica registry, and every limit's
// refusals per minute over the last 15 minutes. readReplicaHealthy says
// whether the read replica (-read-replica-url) serves history reads now;
// null without one.
func (a *App) handleLimits(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := dbContext(r.Context())
	defer cancel()
	resp, err := a.readLimits(ctx)
	if err != nil {
		a.dbError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}
