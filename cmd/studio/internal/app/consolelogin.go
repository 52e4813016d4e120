package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pglimit/pglimit/cmd/studio/internal/studiodb"
)

// consoleProbeUser is the console login setupConsole makes and logs in as
// to learn whether per-user console roles work (a user of this name would
// share a role that runs nothing else).
const consoleProbeUser = "(probe)"

// consoleShared is what the console loses when its users share one session
// role, as its log line says.
const consoleShared = "console users share one session role: each can read the others' running statements in pg_stat_activity and cancel or terminate them"

// setupConsole chooses how the SQL console logs in
// (chooseConsoleLogin), then reads what its statements run with and says
// what they lost (checkConsoleResources).
func (a *App) setupConsole(ctx context.Context) error {
	if err := a.chooseConsoleLogin(ctx); err != nil {
		return err
	}
	return a.checkConsoleResources(ctx)
}

// chooseConsoleLogin chooses how the SQL console logs in, best first:
//
//   - -sql-console-url, when given, as it is (a failure is fatal);
//   - each user as a role of their own, made on first use
//     (console_login_role), when the service's role may create roles and
//     such a role can log in: no console user can see or signal another's
//     statements;
//   - the shared studio_console role, when it can log in;
//   - the service's own role with SET ROLE studio_console, which a
//     statement can undo, or without it, in a read-only transaction.
//
// Every choice but the second says in the log what the console lost.
func (a *App) chooseConsoleLogin(ctx context.Context) error {
	if a.cfg.SQLConsoleURL != "" {
		cfg, err := a.consoleConfig(a.cfg.SQLConsoleURL)
		if err == nil {
			err = a.checkConsole(ctx, cfg, "")
		}
		if err != nil {
			return fmt.Errorf("-sql-console-url: %w", err)
		}
		a.consoleBase = cfg
		a.log.Warn("the SQL console logs in as the one role of -sql-console-url (SECURITY.md)", "lost", consoleShared)
		return nil
	}
	base, err := a.consoleConfig(a.cfg.DatabaseURL)
	if err != nil {
		return err
	}
	a.consoleBase = base
	why, err := a.perUserConsole(ctx)
	if err != nil {
		return err
	}
	if why == "" {
		a.consolePerUser = true
		a.log.Info("the SQL console logs each user in as a role of their own")
		return nil
	}
	shared := base.Copy()
	shared.User, shared.Password = "studio_console", ""
	if err := a.checkConsole(ctx, shared, "studio_console"); err == nil {
		a.consoleBase = shared
		a.log.Warn("the SQL console logs in as studio_console: it cannot give each user a role of their own (SECURITY.md)",
			"why", why, "lost", consoleShared)
		return nil
	}
	a.consoleOnPrimary = true
	a.consoleRole, err = a.q.ConsoleRoleUsable(ctx, a.primary)
	if err != nil {
		return err
	}
	if a.consoleRole {
		a.log.Warn("the SQL console cannot log in as studio_console; it runs as the service with SET ROLE studio_console, which a statement can undo: give -sql-console-url (SECURITY.md)",
			"why", why, "lost", consoleShared)
	} else {
		a.log.Warn("the SQL console runs as the service's own role in a read-only transaction: the studio_console role could not be created or used; give -sql-console-url (SECURITY.md)",
			"why", why, "lost", consoleShared)
	}
	return nil
}

// perUserConsole makes the probe's console role and logs in as it; it
// returns why per-user console roles cannot be used, or "" when they can.
// An error is a database that cannot be asked.
func (a *App) perUserConsole(ctx context.Context) (string, error) {
	can, err := a.q.ConsoleCanCreateRoles(ctx, a.primary)
	if err != nil {
		return "", err
	}
	if !can {
		return "the service's role has neither CREATEROLE nor SUPERUSER", nil
	}
	cfg, err := a.consoleLogin(ctx, consoleProbeUser)
	if err != nil {
		return "a console role could not be made: " + err.Error(), nil
	}
	if err := a.checkConsole(ctx, cfg, cfg.User); err != nil {
		return "a console role cannot log in: " + err.Error(), nil
	}
	return "", nil
}

// consoleConfig is the configuration of a console connection to url: its
// own application_name, and no message from the database longer than
// maxRowBytes, refused before its body is read.
func (a *App) consoleConfig(url string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = "studio " + a.cfg.ReplicaName + " console"
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 5 * time.Second
	}
	cfg.BuildFrontend = func(r io.Reader, w io.Writer) *pgproto3.Frontend {
		f := pgproto3.NewFrontend(r, w)
		f.SetMaxBodyLen(maxRowBytes)
		return f
	}
	return cfg, nil
}

// checkConsole logs in with cfg and checks the session is not a superuser
// (and is user want, when given).
func (a *App) checkConsole(ctx context.Context, cfg *pgx.ConnConfig, want string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	who, err := a.q.ConsoleSession(ctx, conn)
	if err != nil {
		return err
	}
	if who.Superuser {
		return fmt.Errorf("the console connection's user %q is a superuser", who.SessionUserName)
	}
	if want != "" && who.SessionUserName != want {
		return fmt.Errorf("the console connection's user is %q, not %q", who.SessionUserName, want)
	}
	return nil
}

// consoleLogin returns the connection configuration of username's own
// console role, making the role (or making it so again: renamed from an
// old name, with the console's resource settings) the first time this
// replica needs it.
func (a *App) consoleLogin(ctx context.Context, username string) (*pgx.ConnConfig, error) {
	if cfg, ok := a.consoleLogins.Load(username); ok {
		return cfg.(*pgx.ConnConfig), nil
	}
	login, err := a.q.ConsoleLoginClaim(ctx, a.primary, username)
	if err != nil {
		return nil, err
	}
	if err := a.q.ConsoleLoginRole(ctx, a.primary, &studiodb.ConsoleLoginRoleParams{RoleName: login.RoleName, OldRoleName: login.OldRoleName,
		Password: login.Password, TempFileLimit: a.cfg.SQLConsoleTempFileLimit, WorkMem: a.cfg.SQLConsoleWorkMem}); err != nil {
		return nil, err
	}
	cfg := a.consoleBase.Copy()
	cfg.User, cfg.Password = login.RoleName, login.Password
	a.consoleLogins.Store(username, cfg)
	return cfg, nil
}

// consoleConnect opens a console connection for username: as their own
// role when the console has per-user roles (a login refused for its
// password makes the role's password so again, once), else as the
// console's one connection, or, on the service's own role, one of the
// primary's pool that is closed after use (release gives its place back).
func (a *App) consoleConnect(ctx context.Context, username string) (conn *pgx.Conn, release func(), err error) {
	switch {
	case a.consoleOnPrimary:
		pc, err := a.primary.Acquire(ctx)
		if err != nil {
			return nil, nil, err
		}
		// The connection is closed after this statement, so the limit
		// never reaches another user of the pool.
		pc.Conn().PgConn().Frontend().SetMaxBodyLen(maxRowBytes)
		return pc.Conn(), pc.Release, nil
	case !a.consolePerUser:
		conn, err = pgx.ConnectConfig(ctx, a.consoleBase)
		return conn, nil, err
	}
	cfg, err := a.consoleLogin(ctx, username)
	if err != nil {
		return nil, nil, err
	}
	conn, err = pgx.ConnectConfig(ctx, cfg)
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) && (pgErr.Code == "28P01" || pgErr.Code == "28000") {
		a.consoleLogins.Delete(username)
		if cfg, err = a.consoleLogin(ctx, username); err != nil {
			return nil, nil, err
		}
		conn, err = pgx.ConnectConfig(ctx, cfg)
	}
	return conn, nil, err
}
