package schema

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// Cluster mode (docs/scaling.md, "ClickHouse cluster mode").
//
// The same migration files describe both modes. In cluster mode every table
// NAME of a file becomes two tables on every node:
//
//   - NAME_local, the file's engine made replicated (MergeTree becomes
//     ReplicatedMergeTree, SummingMergeTree ReplicatedSummingMergeTree, ...)
//     with the ZooKeeper path /clickhouse/tables/{shard}/DB/NAME_local and
//     the replica name {replica}, both macros of the node's config: the
//     replicas of a shard share the path and copy each other's parts;
//   - NAME, a Distributed table over NAME_local on every shard of the
//     cluster. Readers (the usage API, the reconcilers, rawscan, policy
//     replay) keep the names they use in single-node mode and read every
//     shard through it.
//
// The meter-consumer writes a Kafka partition's batches into the _local
// tables of the shard that owns the partition (chsink.ShardOf); rows
// written by the usage API and the notifier (portal tokens, webhook
// deliveries) go through the Distributed table, by its sharding key.
//
// DDL runs on every node (no ON CLUSTER: it needs the distributed DDL queue
// configured, and per-node statements are as idempotent on 18.16 as on
// current releases); each node records its own versions in its own,
// unreplicated schema_migrations.

// LocalSuffix names a table's replicated local part in cluster mode.
const LocalSuffix = "_local"

// shardingKeys is each table's Distributed sharding key. The meter-consumer
// never inserts through the Distributed tables of its four tables, so their
// keys only say where a row would go if someone did: decisions_raw by
// kafka_partition (with equal weights the same shard as chsink.ShardOf,
// partition mod shards). A migration creating a new table must add it here.
var shardingKeys = map[string]string{
	DecisionsRaw:        "kafka_partition",
	EventIDs:            "kafka_partition",
	UsageMinute:         "rand()",
	UsageHour:           "rand()",
	UsageDay:            "rand()",
	UsageRegionMinute:   "rand()",
	UsageRegionHour:     "rand()",
	UsageRegionDay:      "rand()",
	ShadowHour:          "rand()",
	PortalTokenEvents:   "cityHash64(id)",
	WebhookDeliveries:   "cityHash64(key)",
	KafkaEpochs:         "kafka_partition",
	NotifierCheckpoints: "kafka_partition",
	PolicyAudit:         "kafka_offset", // a record written twice lands on one shard, where FINAL collapses it
	RolloutShadow:       "rand()",
	BillingStatements:   "cityHash64(key)",
	BillingCorrections:  "cityHash64(id)",
	BillingExports:      "cityHash64(identifier)",
	SlotsMinute:         "rand()",
	BillingExportPlans:  "cityHash64(identifier)",
}

var (
	createTable = regexp.MustCompile(`^CREATE TABLE IF NOT EXISTS \$\{DB\}\.([A-Za-z_][A-Za-z0-9_]*)\s`)
	alterTable  = regexp.MustCompile(`^ALTER TABLE \$\{DB\}\.([A-Za-z_][A-Za-z0-9_]*)\s`)
	engineCall  = regexp.MustCompile(`\bENGINE\s*=\s*([A-Za-z]*MergeTree)\s*\(`)
	validName   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// ClusterStatements is the cluster form of one migration statement (with
// ${DB} still in place) for the cluster named cluster: a CREATE TABLE
// becomes the replicated local table and the Distributed table over it; an
// ALTER TABLE applies to both (the local one first: a Distributed table
// must not name a column its local tables lack). Any other statement has
// no cluster form and is an error, so that a new kind of migration cannot
// silently create an unreplicated table on one node.
func ClusterStatements(stmt, cluster string) ([]string, error) {
	if !validName.MatchString(cluster) {
		return nil, fmt.Errorf("schema: invalid cluster name %q", cluster)
	}
	if m := createTable.FindStringSubmatch(stmt); m != nil {
		name := m[1]
		key, ok := shardingKeys[name]
		if !ok {
			return nil, fmt.Errorf("schema: table %s has no sharding key for cluster mode (schema/cluster.go)", name)
		}
		loc := engineCall.FindStringSubmatchIndex(stmt)
		if loc == nil {
			return nil, fmt.Errorf("schema: table %s: no *MergeTree engine to replicate", name)
		}
		open := loc[1] - 1 // the "(" of the engine's arguments
		closing, err := matchParen(stmt, open)
		if err != nil {
			return nil, fmt.Errorf("schema: table %s: %w", name, err)
		}
		args := strings.TrimSpace(stmt[open+1 : closing])
		local := name + LocalSuffix
		repl := fmt.Sprintf("'/clickhouse/tables/{shard}/${DB}/%s', '{replica}'", local)
		if args != "" {
			repl += ", " + args
		}
		engine := stmt[loc[2]:loc[3]]
		localStmt := stmt[:loc[2]] + "Replicated" + engine + "(" + repl + ")" + stmt[closing+1:]
		localStmt = strings.Replace(localStmt, "${DB}."+name, "${DB}."+local, 1)
		dist := fmt.Sprintf("CREATE TABLE IF NOT EXISTS ${DB}.%s AS ${DB}.%s ENGINE = Distributed(%s, ${DB}, %s, %s)",
			name, local, cluster, local, key)
		return []string{localStmt, dist}, nil
	}
	if m := alterTable.FindStringSubmatch(stmt); m != nil {
		name := m[1]
		local := strings.Replace(stmt, "${DB}."+name, "${DB}."+name+LocalSuffix, 1)
		return []string{local, stmt}, nil
	}
	return nil, fmt.Errorf("schema: statement has no cluster form (only CREATE TABLE IF NOT EXISTS and ALTER TABLE have one): %.60q", stmt)
}

// matchParen returns the index of the ")" closing the "(" at open.
func matchParen(s string, open int) (int, error) {
	depth := 0
	inQuote := false
	for i := open; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\'' && (i == 0 || s[i-1] != '\\'):
			inQuote = !inQuote
		case inQuote:
		case c == '(':
			depth++
		case c == ')':
			depth--
			if depth == 0 {
				return i, nil
			}
		}
	}
	return 0, fmt.Errorf("unbalanced parentheses in engine arguments")
}

// Incomplete is ApplyCluster's error when some nodes did not answer but
// every shard had one that did: the schema is usable (every shard's tables
// are there, on the replicas that answered), and the skipped nodes still
// need the migrations (apply again when they are back).
type Incomplete struct {
	Skipped []string // "shard i replica j: error"
}

func (e *Incomplete) Error() string {
	return "schema: nodes not migrated (unreachable): " + strings.Join(e.Skipped, "; ")
}

// ApplyCluster applies every migration, in cluster form, to every node of
// the cluster (shards[i][j]: a connection to replica j of shard i), in
// lockstep: migration N on every node before N+1 on any. A replicated
// table's structure lives in ZooKeeper, shared by the replicas of a shard:
// an ALTER run on one replica reaches the others (the next node then finds
// the column and skips it), and a replica created after its sibling was
// altered must be created with the structure of then, not of now. Each
// node records its own versions. Applying twice changes nothing; safe from
// several processes at once, like Apply.
//
// A node that does not answer at the start is skipped as long as another
// replica of its shard answers (a replica down must not keep a consumer
// from starting): the others are migrated and the error is *Incomplete.
func ApplyCluster(ctx context.Context, shards [][]driver.Conn, database, cluster string) error {
	if len(shards) == 0 {
		return fmt.Errorf("schema: cluster %s: no node to migrate", cluster)
	}
	form := func(stmt string) ([]string, error) { return ClusterStatements(stmt, cluster) }
	type node struct {
		conn    driver.Conn
		name    string
		applied map[uint32]bool
	}
	var nodes []node
	var migs []Migration
	skipped := &Incomplete{}
	for i, shard := range shards {
		up := 0
		var errs []string
		for j, conn := range shard {
			name := fmt.Sprintf("shard %d replica %d", i+1, j+1)
			m, applied, err := begin(ctx, conn, database)
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", name, err))
				continue
			}
			migs = m
			nodes = append(nodes, node{conn, name, applied})
			up++
		}
		if up == 0 {
			return fmt.Errorf("schema: cluster %s: no replica of shard %d answers: %s", cluster, i+1, strings.Join(errs, "; "))
		}
		skipped.Skipped = append(skipped.Skipped, errs...)
	}
	for _, m := range migs {
		for _, n := range nodes {
			if n.applied[m.Version] {
				continue
			}
			if err := applyOne(ctx, n.conn, database, m, form); err != nil {
				return fmt.Errorf("schema: cluster %s %s: %w", cluster, n.name, err)
			}
		}
	}
	if len(skipped.Skipped) > 0 {
		return skipped
	}
	return nil
}
