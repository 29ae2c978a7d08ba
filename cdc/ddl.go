package cdc

import (
	"regexp"
	"strconv"
	"strings"
)

// DDL types (TiDB model.ActionType) that only change TiDB-specific state. They have no
// MySQL equivalent and are skipped (recorded as applied, logged).
var tidbOnlyDDL = map[int]string{
	16: "shard row id bits",
	30: "TiFlash replica",
	31: "TiFlash replica status",
	39: "auto id cache",
	40: "auto random base",
	49: "table attributes",
	50: "partition attributes",
	51: "placement policy",
	52: "placement policy",
	53: "placement policy",
	54: "placement policy",
	55: "placement policy",
	56: "placement policy",
	57: "cache table",
	59: "no cache table",
	62: "flashback cluster",
	65: "TTL",
	67: "TTL",
	68: "resource group",
	69: "resource group",
	70: "resource group",
	73: "columnar index",
	74: "engine attribute",
	75: "table mode",
	76: "refresh meta",
	77: "schema read only",
}

// TiDB-only clauses removed from statements MySQL otherwise accepts. TiCDC usually puts
// them in /*T![feature] */ comments (which MySQL ignores), but a statement may carry
// them bare. The patterns run on the masked statement (see mask), where every string
// literal and quoted identifier is a placeholder matched by lit.
const lit = "\x01\\d+\x02"

var tidbClauses = []*regexp.Regexp{
	regexp.MustCompile(`(?i)\bAUTO_RANDOM\s*(\(\s*\d+\s*(,\s*\d+\s*)?\))?`),
	regexp.MustCompile(`(?i)\bAUTO_RANDOM_BASE\s*=?\s*\d+`),
	regexp.MustCompile(`(?i)\bSHARD_ROW_ID_BITS\s*=?\s*\d+`),
	regexp.MustCompile(`(?i)\bPRE_SPLIT_REGIONS\s*=?\s*\d+`),
	regexp.MustCompile(`(?i)\bAUTO_ID_CACHE\s*=?\s*\d+`),
	regexp.MustCompile(`(?i)\bNONCLUSTERED\b`),
	regexp.MustCompile(`(?i)\bCLUSTERED\b`),
	regexp.MustCompile(`(?i)\bPLACEMENT\s+POLICY\s*=?\s*(DEFAULT|` + lit + `|\w+)`),
	regexp.MustCompile(`(?i)\bTTL_ENABLE\s*=?\s*` + lit),
	regexp.MustCompile(`(?i)\bTTL_JOB_INTERVAL\s*=?\s*` + lit),
	regexp.MustCompile(`(?i)\bTTL\s*=\s*(` + lit + `|\w+)\s*\+\s*INTERVAL\s+(` + lit + `|[\w.]+)\s+\w+`),
	regexp.MustCompile(`(?i)\bSTATS_(BUCKETS|TOPN|CMSKETCH_WIDTH|CMSKETCH_DEPTH|SAMPLE_RATE|COL_CHOICE|COL_LIST)\s*=?\s*(` + lit + `|[\d.]+)`),
}

var (
	// tidbComment matches TiDB's feature comments /*T![feature] ... */ and /*T! ... */.
	tidbComment = regexp.MustCompile(`(?s)/\*T!(\[[^\]]*\])?.*?\*/`)
	anyComment  = regexp.MustCompile(`(?s)/\*.*?\*/`)
)

// translateDDL turns a TiDB DDL into one MySQL accepts. skip is true (with a reason)
// for DDLs that only change TiDB-specific state.
func translateDDL(query string, ddlType int) (out string, skip bool, reason string) {
	if r, ok := tidbOnlyDDL[ddlType]; ok {
		return "", true, r
	}
	masked, lits := mask(query)
	up := strings.ToUpper(strings.TrimSpace(anyComment.ReplaceAllString(masked, " ")))
	for _, p := range []string{"CREATE PLACEMENT POLICY", "ALTER PLACEMENT POLICY", "DROP PLACEMENT POLICY",
		"CREATE RESOURCE GROUP", "ALTER RESOURCE GROUP", "DROP RESOURCE GROUP", "FLASHBACK "} {
		if strings.HasPrefix(up, p) {
			return "", true, strings.ToLower(p)
		}
	}
	masked = tidbComment.ReplaceAllString(masked, "")
	for _, re := range tidbClauses {
		masked = re.ReplaceAllString(masked, "")
	}
	return unmask(masked, lits), false, ""
}

var placeholder = regexp.MustCompile(lit)

// mask replaces string literals and quoted identifiers with numbered placeholders, so
// the clause patterns never touch a column called `clustered` or a comment text.
func mask(q string) (string, []string) {
	var out strings.Builder
	var lits []string
	for i := 0; i < len(q); i++ {
		c := q[i]
		if c != '\'' && c != '"' && c != '`' {
			out.WriteByte(c)
			continue
		}
		j := i + 1
		for j < len(q) {
			if q[j] == '\\' && c != '`' {
				j += 2
				continue
			}
			if q[j] == c {
				if j+1 < len(q) && q[j+1] == c { // doubled quote
					j += 2
					continue
				}
				break
			}
			j++
		}
		if j >= len(q) {
			j = len(q) - 1
		}
		out.WriteString("\x01" + strconv.Itoa(len(lits)) + "\x02")
		lits = append(lits, q[i:j+1])
		i = j
	}
	return out.String(), lits
}

func unmask(s string, lits []string) string {
	return placeholder.ReplaceAllStringFunc(s, func(m string) string {
		n, err := strconv.Atoi(m[1 : len(m)-1])
		if err != nil || n >= len(lits) {
			return m
		}
		return lits[n]
	})
}

// idempotentDDL makes statements that can be repeated after a crash between executing a
// DDL and recording it repeat harmlessly.
var (
	createTableRe = regexp.MustCompile(`(?i)^\s*CREATE\s+TABLE\s+`)
	createDBRe    = regexp.MustCompile(`(?i)^\s*CREATE\s+(DATABASE|SCHEMA)\s+`)
	dropTableRe   = regexp.MustCompile(`(?i)^\s*DROP\s+TABLE\s+`)
	dropDBRe      = regexp.MustCompile(`(?i)^\s*DROP\s+(DATABASE|SCHEMA)\s+`)
	ifExistsRe    = regexp.MustCompile(`(?i)^\s*(CREATE|DROP)\s+(TABLE|DATABASE|SCHEMA)\s+IF\s+(NOT\s+)?EXISTS\b`)
)

func idempotentDDL(q string) string {
	if ifExistsRe.MatchString(q) {
		return q
	}
	switch {
	case createTableRe.MatchString(q):
		return createTableRe.ReplaceAllString(q, "CREATE TABLE IF NOT EXISTS ")
	case createDBRe.MatchString(q):
		return createDBRe.ReplaceAllString(q, "CREATE $1 IF NOT EXISTS ")
	case dropTableRe.MatchString(q):
		return dropTableRe.ReplaceAllString(q, "DROP TABLE IF EXISTS ")
	case dropDBRe.MatchString(q):
		return dropDBRe.ReplaceAllString(q, "DROP $1 IF EXISTS ")
	}
	return q
}
