package loadgen

import (
	"fmt"
	"regexp"
	"strings"
)

// Topic expressions: TiCDC routes each table's changes to a topic named by a dispatcher
// rule's topic expression (tiflow cdc/sink/dmlsink/mq/dispatcher/topic/expression.go),
// [prefix]{schema}[middle][{table}][suffix], the literal parts of Kafka's topic
// alphabet [A-Za-z0-9._-]. loadgen takes the per-schema form, [prefix]{schema}[suffix]
// (topic-per-schema routing: one fallback's schemas in their own topics), and a topic
// without a placeholder (every schema in one topic).

// SchemaPlaceholder in Config.Topic is replaced by each schema's name.
const SchemaPlaceholder = "{schema}"

// kafkaTopicMaxLength is Kafka's limit on a topic name (TiCDC truncates to it).
const kafkaTopicMaxLength = 249

var (
	topicLiteral = regexp.MustCompile(`^[A-Za-z0-9._-]*$`)
	placeholder  = regexp.MustCompile(`\{[^{}]*\}`)
	// kafkaForbidden are the characters TiCDC replaces with '_' when it puts a schema
	// name into a topic name.
	kafkaForbidden = regexp.MustCompile(`[^A-Za-z0-9._-]`)
)

// validateTopic reports what is wrong with a topic or topic expression: an empty one, a
// placeholder other than {schema} (TiCDC's {table} included: loadgen routes per schema),
// {schema} twice, or a character outside Kafka's topic alphabet.
func validateTopic(expr string) error {
	if expr == "" {
		return fmt.Errorf("required")
	}
	var problems []string
	n := 0
	for _, ph := range placeholder.FindAllString(expr, -1) {
		switch ph {
		case SchemaPlaceholder:
			n++
		case "{table}":
			problems = append(problems, "placeholder {table} is not supported (loadgen routes per schema: [prefix]{schema}[suffix])")
		default:
			problems = append(problems, fmt.Sprintf("unknown placeholder %s (the only one is {schema})", ph))
		}
	}
	if n > 1 {
		problems = append(problems, "{schema} may appear once")
	}
	literal := placeholder.ReplaceAllString(expr, "")
	if !topicLiteral.MatchString(literal) {
		bad := kafkaForbidden.FindAllString(literal, -1)
		problems = append(problems, fmt.Sprintf("characters %q are not allowed in a Kafka topic name (want [A-Za-z0-9._-] besides {schema})", strings.Join(bad, "")))
	}
	if n == 0 && (expr == "." || expr == "..") {
		problems = append(problems, fmt.Sprintf("%q is not a valid Kafka topic name", expr))
	}
	if len(literal) > kafkaTopicMaxLength {
		problems = append(problems, fmt.Sprintf("longer than Kafka's %d characters", kafkaTopicMaxLength))
	}
	if len(problems) > 0 {
		return fmt.Errorf("%q: %s", expr, strings.Join(problems, "; "))
	}
	return nil
}

// topicFor is the topic a schema's changes go to: expr with {schema} replaced by the
// schema's name, as TiCDC substitutes it (every character outside [A-Za-z0-9._-]
// becomes '_', the name is cut at 249 characters, "." and ".." become "_" and "__").
func topicFor(expr, schema string) string {
	if !strings.Contains(expr, SchemaPlaceholder) {
		return expr
	}
	name := strings.ReplaceAll(expr, SchemaPlaceholder, kafkaForbidden.ReplaceAllString(schema, "_"))
	switch {
	case len(name) > kafkaTopicMaxLength:
		return name[:kafkaTopicMaxLength]
	case name == ".":
		return "_"
	case name == "..":
		return "__"
	}
	return name
}
