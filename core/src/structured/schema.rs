//! JSON Schemas as Pocket enforces them: every keyword either constrains
//! the answer or is refused with the keyword's name. llguidance refuses the
//! keywords it does not implement; this adds the ones it would accept but
//! not enforce (found by checking every schema of the JSON Schema Test
//! Suite against its valid and invalid instances, `core/tests/structured.rs`),
//! and bounds the whitespace a weak model may put between items.

use serde_json::{json, Map, Value};

/// Between JSON items: nothing, one space, or a newline and up to 16 spaces
/// of indentation (llama.cpp's grammars bound it the same way).
pub const WHITESPACE: &str = r"(?:[ ]?|\n[ ]{0,16})";

/// Keywords refused wherever they appear, and why.
const NOT_ENFORCED: &[(&str, &str)] = &[
    ("if", "conditional subschemas"),
    ("then", "conditional subschemas"),
    ("else", "conditional subschemas"),
    ("not", "negation"),
    ("contains", "array containment"),
    ("minContains", "array containment"),
    ("maxContains", "array containment"),
    ("uniqueItems", "unique array items"),
    ("propertyNames", "property name schemas"),
    ("dependentRequired", "dependent properties"),
    ("dependentSchemas", "dependent schemas"),
    ("dependencies", "dependent properties"),
    ("unevaluatedProperties", "unevaluated properties"),
    ("unevaluatedItems", "unevaluated items"),
    ("$dynamicRef", "dynamic references"),
    ("$dynamicAnchor", "dynamic references"),
    ("$recursiveRef", "recursive references"),
];

/// The schema ready for llguidance: refused keywords named, bounded
/// whitespace set (a caller's own `x-guidance` options win).
pub fn prepare(mut schema: Value) -> Result<Value, String> {
    check(&schema, "#", 0)?;
    if let Value::Object(map) = &mut schema {
        let options = map.entry("x-guidance").or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(o) = options {
            o.entry("whitespace_pattern").or_insert_with(|| json!(WHITESPACE));
            o.entry("whitespace_flexible").or_insert(json!(false));
        }
    } else if !schema.is_boolean() {
        return Err("a schema must be a JSON object or a boolean".into());
    }
    Ok(schema)
}

/// Deepest nesting of subschemas accepted.
const MAX_DEPTH: usize = 64;

/// Walk every subschema position (not `const`/`enum`/`default` data) for refused keywords.
fn check(v: &Value, at: &str, depth: usize) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!("{at}: schemas nested deeper than {MAX_DEPTH}"));
    }
    let Value::Object(map) = v else { return Ok(()) };
    for (k, sub) in map {
        if let Some((_, what)) = NOT_ENFORCED.iter().find(|(name, _)| name == k) {
            return Err(format!("{at}: keyword '{k}' ({what}) is not enforced by the engine"));
        }
        let here = format!("{at}/{k}");
        match k.as_str() {
            "const" | "enum" | "default" | "examples" | "x-guidance" | "required" => {}
            "properties" | "patternProperties" | "$defs" | "definitions" => {
                if let Value::Object(props) = sub {
                    for (name, s) in props {
                        check(s, &format!("{here}/{name}"), depth + 1)?;
                    }
                }
            }
            "allOf" | "anyOf" | "oneOf" | "prefixItems" => {
                if let Value::Array(items) = sub {
                    for (i, s) in items.iter().enumerate() {
                        check(s, &format!("{here}/{i}"), depth + 1)?;
                    }
                }
            }
            _ => check(sub, &here, depth + 1)?,
        }
    }
    Ok(())
}
