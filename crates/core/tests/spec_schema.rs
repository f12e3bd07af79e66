//! docs/spec.schema.json is what the registry generates (`spec_schema::spec_schema_text`).
//! `LOGITS_PROCESSING_WRITE_SCHEMA=1 cargo test -p logits-processing --test spec_schema` rewrites
//! it. (python/tests/test_spec_schema.py validates the docs' examples and bad specs against it.)

use logits_processing::spec_schema::spec_schema;

// The published file describes the default build, whose kinds include the grammars.
#[cfg(feature = "grammar")]
#[test]
fn the_published_schema_is_the_generated_one() {
    use logits_processing::spec_schema::spec_schema_text;
    const PUBLISHED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/spec.schema.json");
    let generated = spec_schema_text();
    if std::env::var_os("LOGITS_PROCESSING_WRITE_SCHEMA").is_some() {
        std::fs::write(PUBLISHED, &generated).unwrap();
    }
    let published = std::fs::read_to_string(PUBLISHED).unwrap_or_default();
    assert!(
        published == generated,
        "docs/spec.schema.json is stale: run LOGITS_PROCESSING_WRITE_SCHEMA=1 cargo test -p \
         logits-processing --test spec_schema"
    );
}

#[test]
fn every_registered_kind_has_a_schema_with_its_description() {
    let schema = spec_schema();
    for kind in logits_processing::spec::kinds() {
        let def = &schema["$defs"][kind];
        assert_eq!(def["properties"]["kind"]["const"], kind);
        assert_eq!(def["required"][0], "kind");
        assert_eq!(def["additionalProperties"], false, "{kind}");
        let description = def["description"].as_str().unwrap_or_default();
        assert!(description.contains(kind), "{kind}: {description:?}");
    }
    assert_eq!(
        spec_schema(),
        schema,
        "the same registry gives the same schema"
    );
}
