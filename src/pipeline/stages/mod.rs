//! The stage registry: `stage = "<name>"` in a pipeline file selects a builder here.

pub mod auto_relate;
pub mod dedupe;
pub mod detect_contradictions;
pub mod embed;
pub mod extract_entities;
pub mod redact_pii;
pub mod sanitize;
pub mod score_surprise;
pub mod write;

use serde::de::DeserializeOwned;

use super::{BuildContext, PipelineError, Stage};

type Builder = fn(toml::Table, &BuildContext) -> Result<Box<dyn Stage>, PipelineError>;

/// Every stage a pipeline file can name.
const REGISTRY: &[(&str, Builder)] = &[
    ("sanitize", sanitize::build),
    ("redact_pii", redact_pii::build),
    ("extract_entities", extract_entities::build),
    ("embed", embed::build),
    ("dedupe", dedupe::build),
    ("score_surprise", score_surprise::build),
    ("detect_contradictions", detect_contradictions::build),
    ("auto_relate", auto_relate::build),
    ("write", write::build),
];

pub fn names() -> impl Iterator<Item = &'static str> {
    REGISTRY.iter().map(|(n, _)| *n)
}

pub fn build(
    name: &str,
    params: toml::Table,
    ctx: &BuildContext,
) -> Result<Box<dyn Stage>, PipelineError> {
    let (_, builder) =
        REGISTRY
            .iter()
            .find(|(n, _)| *n == name)
            .ok_or_else(|| PipelineError::Config {
                stage: name.to_string(),
                message: format!(
                    "unknown stage; known stages: {}",
                    names().collect::<Vec<_>>().join(", ")
                ),
            })?;
    builder(params, ctx)
}

/// A stage's parameters as its config struct (which denies unknown fields).
pub(crate) fn parse_params<T: DeserializeOwned>(
    stage: &str,
    params: toml::Table,
) -> Result<T, PipelineError> {
    toml::Value::Table(params)
        .try_into()
        .map_err(|e: toml::de::Error| PipelineError::Config {
            stage: stage.to_string(),
            message: e.message().to_string(),
        })
}
