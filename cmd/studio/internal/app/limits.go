package app

import (
	"net/http"
	"time"

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
}

// handleLimits is the operator view (GET /api/limits): every live permit,
// throttle, upload window and in-flight row, as plain rows of the limit
// tables, and the replica registry. It always reads the primary: UNLOGGED
// tables are not replicated. readReplicaHealthy says whether the read
// replica (-read-replica-url) serves history reads now; null without one.
func (a *App) handleLimits(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := dbContext(r.Context())
	defer cancel()
	resp := limitsResponse{
		Permits: []limitRow{}, Throttles: []throttleRow{}, UploadWindows: []limitRow{}, InFlight: []limitRow{}, Replicas: []replicaRow{},
		InstallationCap: a.endpoints.sqlConsole.InstallationLimit(),
	}
	if a.router.HasReplica() {
		healthy := a.router.Healthy()
		resp.ReadReplica = &healthy
	}
	for _, kind := range []struct {
		kind permit.Kind
		into *[]limitRow
	}{{permit.HeavyPermit, &resp.Permits}, {permit.UploadWindow, &resp.UploadWindows}, {permit.RequestInFlight, &resp.InFlight}} {
		held, err := permit.List(ctx, a.primary, kind.kind)
		if err != nil {
			a.dbError(w, r, err)
			return
		}
		for _, h := range held {
			*kind.into = append(*kind.into, limitRow{Scope: h.Scope, Slot: int32(h.Slot), Holder: h.Holder, Endpoint: h.Endpoint,
				Replica: h.Replica, ClaimedAt: h.ClaimedAt, ExpiresAt: h.ExpiresAt})
		}
	}
	throttles, err := a.signin.List(ctx)
	if err != nil {
		a.dbError(w, r, err)
		return
	}
	for _, t := range throttles {
		resp.Throttles = append(resp.Throttles, throttleRow{Key: t.Key, Failures: int32(t.Failures), FirstAt: t.FirstAt, LastAt: t.LastAt, ExpiresAt: t.ExpiresAt})
	}
	replicas, err := a.registry.List(ctx)
	if err != nil {
		a.dbError(w, r, err)
		return
	}
	for _, rep := range replicas {
		resp.Replicas = append(resp.Replicas, replicaRow(rep))
		if rep.Ready {
			resp.ReadyReplicas++
		}
	}
	resp.ReadyReplicas = max(resp.ReadyReplicas, 1)
	writeJSON(w, http.StatusOK, resp)
}
