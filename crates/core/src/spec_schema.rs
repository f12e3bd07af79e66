//! The spec language as a JSON Schema (draft 2020-12), generated from the registry: each kind's
//! schema is derived (`schemars`) from the same struct serde reads its spec into, with the struct's
//! doc comment as its description, so a kind added to [`crate::processors::KINDS`] appears here
//! with no other change. docs/spec.schema.json is this function's output (a test keeps it so).
//!
//! The schema checks structure: the kinds, their fields, the fields' JSON types, which are
//! required, that no others are there, and the pipeline's length; and each numeric field's
//! documented range (`minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`: a temperature
//! `>= 1e-30`), which admission refuses past, naming the field (a test tries each edge). What
//! depends on several fields, token ids against a vocab, and a grammar's own text are checked at
//! admission only ([`crate::ProcessorSpec::validate`]), whose errors name the field.
//!
//! ```
//! let schema = logits_processing::spec_schema::spec_schema();
//! let kinds = schema["$defs"]["spec"]["oneOf"].as_array().unwrap();
//! assert_eq!(kinds.len(), logits_processing::spec::kinds().count());
//! ```

use schemars::generate::SchemaSettings;
use serde_json::{json, Map, Value};

use crate::processors::KINDS;
use crate::spec::MAX_PIPELINE_LEN;

/// The JSON Schema of a pipeline: one spec object, or a list of at most [`MAX_PIPELINE_LEN`].
/// Each kind is `$defs/<kind>`; `$defs/spec` is any one of them. Deterministic: the same registry
/// gives the same value.
pub fn spec_schema() -> Value {
    let mut generator = SchemaSettings::draft2020_12().into_generator();
    let mut defs = Map::new();
    let mut one_of = Vec::new();
    for kind in KINDS {
        let mut schema = (kind.schema)(&mut generator).to_value();
        let object = schema
            .as_object_mut()
            .expect("a spec struct's schema is an object");
        // A title from the type's name says nothing to a client; the kind is its name.
        object.remove("title");
        object.insert("title".into(), Value::String(kind.name.into()));
        let properties = object
            .entry("properties")
            .or_insert_with(|| json!({}))
            .as_object_mut()
            .expect("properties is an object");
        let mut with_kind = Map::new();
        with_kind.insert("kind".into(), json!({"const": kind.name}));
        with_kind.append(properties);
        *properties = with_kind;
        let required = object
            .entry("required")
            .or_insert_with(|| json!([]))
            .as_array_mut()
            .expect("required is a list");
        required.insert(0, Value::String("kind".into()));
        object.insert("additionalProperties".into(), Value::Bool(false));
        one_of.push(json!({"$ref": format!("#/$defs/{}", kind.name)}));
        defs.insert(kind.name.into(), schema);
    }
    for (name, schema) in generator.take_definitions(true) {
        assert!(
            !defs.contains_key(&name),
            "a field type is named like a kind: {name}"
        );
        defs.insert(name, schema);
    }
    defs.insert(
        "spec".into(),
        json!({
            "description": "One processor: a registered kind and its fields.",
            "oneOf": one_of,
        }),
    );
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "logits-processing pipeline",
        "description": format!(
            "A request's logits processors: one spec object, or a list of at most \
             {MAX_PIPELINE_LEN} applied in order. Structure and each number's range: what depends \
             on several fields, token ids against the vocab and grammar texts are checked at \
             admission."
        ),
        "oneOf": [
            {"$ref": "#/$defs/spec"},
            {"type": "array", "items": {"$ref": "#/$defs/spec"}, "maxItems": MAX_PIPELINE_LEN},
        ],
        "$defs": defs,
    })
}

/// [`spec_schema`] as the text published in docs/spec.schema.json: two-space indents, a final
/// newline.
pub fn spec_schema_text() -> String {
    let mut text = serde_json::to_string_pretty(&spec_schema()).expect("plain JSON");
    text.push('\n');
    text
}
