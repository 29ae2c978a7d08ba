package cdc

import (
	"regexp"
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
// them bare.
var tidbClauses = []*regexp.Regexp{
	regexp.MustCompile(`(?i)\bAUTO_RANDOM\s*(\(\s*\d+\s*(,\s*\d+\s*)?\))?`),
	regexp.MustCompile(`(?i)\bAUTO_RANDOM_BASE\s*=?\s*\d+`),
	regexp.MustCompile(`(?i)\bSHARD_ROW_ID_BITS\s*=?\s*\d+`),
	regexp.MustCompile(`(?i)\bPRE_SPLIT_REGIONS\s*=?\s*\d+`),
	regexp.MustCompile(`(?i)\bAUTO_ID_CACHE\s*=?\s*\d+`),
	regexp.MustCompile(`(?i)\bNONCLUSTERED\b`),
	regexp.MustCompile(`(?i)\bCLUSTERED\b`),
	regexp.MustCompile(`(?i)\bPLACEMENT\s+POLICY\s*=?\s*(DEFAULT|` + "`[^`]*`" + `|\w+)`),
	regexp.MustCompile(`(?i)\bTTL_ENABLE\s*=?\s*'[^']*'`),
	regexp.MustCompile(`(?i)\bTTL_JOB_INTERVAL\s*=?\s*'[^']*'`),
	regexp.MustCompile(`(?i)\bTTL\s*=\s*` + "`?\\w+`?" + `\s*\+\s*INTERVAL\s+\S+\s+\w+`),
	regexp.MustCompile(`(?i)\bSTATS_(BUCKETS|TOPN|CMSKETCH_WIDTH|CMSKETCH_DEPTH|SAMPLE_RATE|COL_CHOICE|COL_LIST)\s*=?\s*('[^']*'|[\d.]+)`),
}

// tidbComment matches TiDB's feature comments /*T![feature] ... */.
var tidbComment = regexp.MustCompile(`/\*T!\[[^\]]*\][^*]*(\*+[^*/][^*]*)*\*+/`)

// translateDDL turns a TiDB DDL into one MySQL accepts. skip is true (with a reason)
// for DDLs that only change TiDB-specific state.
func translateDDL(query string, ddlType int) (out string, skip bool, reason string) {
	if r, ok := tidbOnlyDDL[ddlType]; ok {
		return "", true, r
	}
	up := strings.ToUpper(strings.TrimSpace(stripComments(query)))
	for _, p := range []string{"CREATE PLACEMENT POLICY", "ALTER PLACEMENT POLICY", "DROP PLACEMENT POLICY",
		"CREATE RESOURCE GROUP", "ALTER RESOURCE GROUP", "DROP RESOURCE GROUP", "FLASHBACK "} {
		if strings.HasPrefix(up, p) {
			return "", true, strings.ToLower(p)
		}
	}
	return rewriteCode(query, func(code string) string {
		code = tidbComment.ReplaceAllString(code, "")
		for _, re := range tidbClauses {
			code = re.ReplaceAllString(code, "")
		}
		return code
	}), false, ""
}

// stripComments removes /* */ comments (outside literals), for classifying a statement.
func stripComments(q string) string {
	return rewriteCode(q, func(code string) string { return tidbComment.ReplaceAllString(code, " ") })
}

// rewriteCode applies f to the parts of q outside string literals and quoted
// identifiers, so a column called `clustered` or a comment 'AUTO_RANDOM' is untouched.
// TiDB feature comments are code here (f decides what to do with them).
func rewriteCode(q string, f func(string) string) string {
	var out strings.Builder
	start := 0
	for i := 0; i < len(q); i++ {
		c := q[i]
		if c != '\'' && c != '"' && c != '`' {
			continue
		}
		out.WriteString(f(q[start:i]))
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
		out.WriteString(q[i : j+1])
		i = j
		start = j + 1
	}
	if start < len(q) {
		out.WriteString(f(q[start:]))
	}
	return out.String()
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
