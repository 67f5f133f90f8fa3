// Package schema holds the ClickHouse DDL of the product as numbered
// migrations (NNNN_name.sql, embedded) and applies them.
//
// Migration files are written in the SQL subset shared by ClickHouse 18.16
// and current releases (see CLICKHOUSE.md). Tables are named fully qualified
// with the literal token ${DB}, which Apply replaces with the database name.
// Statements in one file are separated by a line containing only ";".
// Every statement must be idempotent (CREATE ... IF NOT EXISTS): a crash
// between a statement and the recording of its migration, or two processes
// applying at once, re-runs it. 18.16 has no ADD COLUMN IF NOT EXISTS, so
// Apply gives "ALTER TABLE ${DB}.t ADD COLUMN c ..." that meaning itself: it
// skips the statement when system.columns already lists t.c.
package schema

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

//go:embed *.sql
var files embed.FS

// Migration is one numbered file of schema/.
type Migration struct {
	Version    uint32   // the NNNN prefix
	Name       string   // the file name
	Statements []string // with ${DB} still in place
}

var fileName = regexp.MustCompile(`^(\d{4})_[a-z0-9_]+\.sql$`)

// addColumn matches the one ALTER form Apply makes idempotent; the groups are
// the table and the column.
var addColumn = regexp.MustCompile(`(?is)^ALTER\s+TABLE\s+\$\{DB\}\.([a-z0-9_]+)\s+ADD\s+COLUMN\s+([a-z0-9_]+)\s`)

// validDatabase matches the database names Apply accepts (ValidDatabase).
var validDatabase = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

// ValidDatabase reports whether name may be a database of Apply: an
// identifier that can be written into DDL and SQL without quoting.
func ValidDatabase(name string) bool { return validDatabase.MatchString(name) }

// Migrations returns the embedded migrations in version order.
func Migrations() ([]Migration, error) {
	entries, err := fs.ReadDir(files, ".")
	if err != nil {
		return nil, fmt.Errorf("schema: read embedded files: %w", err)
	}
	var out []Migration
	seen := map[uint32]string{}
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("schema: %s: file name is not NNNN_name.sql", e.Name())
		}
		v, _ := strconv.ParseUint(m[1], 10, 32)
		if prev, dup := seen[uint32(v)]; dup {
			return nil, fmt.Errorf("schema: %s and %s share version %d", prev, e.Name(), v)
		}
		seen[uint32(v)] = e.Name()
		body, err := files.ReadFile(e.Name())
		if err != nil {
			return nil, fmt.Errorf("schema: read %s: %w", e.Name(), err)
		}
		stmts := split(string(body))
		if len(stmts) == 0 {
			return nil, fmt.Errorf("schema: %s has no statement", e.Name())
		}
		out = append(out, Migration{Version: uint32(v), Name: e.Name(), Statements: stmts})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// split cuts a file at lines holding only ";" and drops comment-only lines
// (ClickHouse 18.16 accepts comments, but a statement made only of comments
// is an error).
func split(body string) []string {
	var stmts []string
	var cur []string
	flush := func() {
		s := strings.TrimSpace(strings.Join(cur, "\n"))
		if s != "" {
			stmts = append(stmts, s)
		}
		cur = cur[:0]
	}
	for _, line := range strings.Split(body, "\n") {
		t := strings.TrimSpace(line)
		switch {
		case t == ";":
			flush()
		case strings.HasPrefix(t, "--"):
		default:
			cur = append(cur, line)
		}
	}
	flush()
	return stmts
}

// Apply creates the database if missing and applies, in order, every
// migration not yet recorded in ${DB}.schema_migrations, recording each one
// after its statements succeeded. Applying twice changes nothing.
// Safe to call from several processes at once (statements are idempotent;
// a version may then be recorded twice, which Version tolerates).
func Apply(ctx context.Context, conn driver.Conn, database string) error {
	return apply(ctx, conn, database, func(stmt string) ([]string, error) { return []string{stmt}, nil })
}

// apply is Apply with each statement of a migration replaced by form's
// statements (itself in single-node mode, ClusterStatements in cluster mode).
func apply(ctx context.Context, conn driver.Conn, database string, form func(stmt string) ([]string, error)) error {
	migs, applied, err := begin(ctx, conn, database)
	if err != nil {
		return err
	}
	for _, m := range migs {
		if applied[m.Version] {
			continue
		}
		if err := applyOne(ctx, conn, database, m, form); err != nil {
			return err
		}
	}
	return nil
}

// begin creates the database and schema_migrations if missing and returns
// the migrations and the versions already applied.
func begin(ctx context.Context, conn driver.Conn, database string) ([]Migration, map[uint32]bool, error) {
	if !ValidDatabase(database) {
		return nil, nil, fmt.Errorf("schema: invalid database name %q", database)
	}
	migs, err := Migrations()
	if err != nil {
		return nil, nil, err
	}
	if err := conn.Exec(ctx, "CREATE DATABASE IF NOT EXISTS "+database); err != nil {
		return nil, nil, fmt.Errorf("schema: create database %s: %w", database, err)
	}
	// ORDER BY version: the table is read whole and is tiny.
	if err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+database+`.schema_migrations (
    version    UInt32,
    name       String,
    applied_at DateTime('UTC')
) ENGINE = MergeTree() ORDER BY version`); err != nil {
		return nil, nil, fmt.Errorf("schema: create schema_migrations: %w", err)
	}
	applied, err := appliedVersions(ctx, conn, database)
	if err != nil {
		return nil, nil, err
	}
	return migs, applied, nil
}

// applyOne runs the statements of m (in form) and then records m.
func applyOne(ctx context.Context, conn driver.Conn, database string, m Migration, form func(stmt string) ([]string, error)) error {
	for i, s := range m.Statements {
		stmts, err := form(s)
		if err != nil {
			return fmt.Errorf("schema: %s statement %d: %w", m.Name, i+1, err)
		}
		for _, st := range stmts {
			if done, err := columnExists(ctx, conn, database, st); err != nil {
				return fmt.Errorf("schema: %s statement %d: %w", m.Name, i+1, err)
			} else if done {
				continue
			}
			if err := conn.Exec(ctx, strings.ReplaceAll(st, "${DB}", database)); err != nil {
				// Another process applying at once may have added the
				// column between the check and the ALTER: its refusal
				// ("column with this name already exists") is success.
				if done, cerr := columnExists(ctx, conn, database, st); cerr == nil && done {
					continue
				}
				return fmt.Errorf("schema: %s statement %d: %w", m.Name, i+1, err)
			}
		}
	}
	// INSERT ... VALUES through Exec hangs on 18.16: use a batch with
	// an explicit column list.
	b, err := conn.PrepareBatch(ctx, "INSERT INTO "+database+".schema_migrations (version, name, applied_at)")
	if err != nil {
		return fmt.Errorf("schema: record %s: %w", m.Name, err)
	}
	if err := b.Append(m.Version, m.Name, time.Now().UTC().Truncate(time.Second)); err != nil {
		_ = b.Abort()
		return fmt.Errorf("schema: record %s: %w", m.Name, err)
	}
	if err := b.Send(); err != nil {
		return fmt.Errorf("schema: record %s: %w", m.Name, err)
	}
	return nil
}

// columnExists reports whether stmt is an ADD COLUMN whose column the table
// already has (a re-run after a crash, or another process applying at once).
func columnExists(ctx context.Context, conn driver.Conn, database, stmt string) (bool, error) {
	m := addColumn.FindStringSubmatch(stmt)
	if m == nil {
		return false, nil
	}
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM system.columns WHERE database = ? AND table = ? AND name = ?",
		database, m[1], m[2]).Scan(&n); err != nil {
		return false, fmt.Errorf("read system.columns for %s.%s: %w", m[1], m[2], err)
	}
	return n > 0, nil
}

// Version returns the highest migration version recorded in database, 0 when
// none is.
func Version(ctx context.Context, conn driver.Conn, database string) (uint32, error) {
	if !ValidDatabase(database) {
		return 0, fmt.Errorf("schema: invalid database name %q", database)
	}
	applied, err := appliedVersions(ctx, conn, database)
	if err != nil {
		return 0, err
	}
	var v uint32
	for k := range applied {
		v = max(v, k)
	}
	return v, nil
}

// Latest is the highest embedded migration version.
func Latest() uint32 {
	migs, err := Migrations()
	if err != nil || len(migs) == 0 {
		return 0
	}
	return migs[len(migs)-1].Version
}

func appliedVersions(ctx context.Context, conn driver.Conn, database string) (map[uint32]bool, error) {
	rows, err := conn.Query(ctx, "SELECT DISTINCT version FROM "+database+".schema_migrations")
	if err != nil {
		return nil, fmt.Errorf("schema: read schema_migrations: %w", err)
	}
	defer rows.Close()
	out := map[uint32]bool{}
	for rows.Next() {
		var v uint32
		if err := rows.Scan(&v); err != nil {
			return nil, fmt.Errorf("schema: scan schema_migrations: %w", err)
		}
		out[v] = true
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("schema: read schema_migrations: %w", err)
	}
	return out, nil
}
