//! What every route's handler shares, below the fronts that use it: the
//! served models and their counters ([`Routes`]), a runner's readiness
//! line, the v2 request bound. `server` builds it and `v2` and `grpc`
//! read it; it knows none of them (so no two of `server`, `v2` and `grpc`
//! import each other).

use std::sync::Arc;

use laned_runner::LanedRunner;

use crate::session::{self, Endpoint, Shared};

/// The largest infer request body (REST) or message (gRPC) for a model of
/// `pulse_bytes`-byte pulses: its pulse as JSON numbers (up to about 24
/// characters an element) and the JSON around it.
pub(crate) fn max_body(pulse_bytes: usize) -> usize {
    pulse_bytes.saturating_mul(8).saturating_add(64 << 10)
}

/// What every route sees.
#[derive(Clone)]
pub(crate) struct Routes {
    pub(crate) shared: Arc<Shared>,
    pub(crate) endpoints: Vec<Arc<Endpoint>>,
    /// The KServe v2 front's live sequences ([`crate::v2`]).
    pub(crate) sequences: Arc<session::sequence::Sequences>,
    /// Each endpoint's statistics (the `statistics` extension), in the
    /// endpoints' order.
    pub(crate) stats: Arc<Vec<crate::stats::ModelStats>>,
    /// The `system_shared_memory` extension's regions, the server's.
    pub(crate) regions: Arc<crate::shm::Regions>,
}

impl Routes {
    pub(crate) fn endpoint(&self, name: &str) -> Option<Arc<Endpoint>> {
        self.endpoints.iter().find(|e| e.name == name).cloned()
    }

    /// Model `name`'s statistics.
    pub(crate) fn stats(&self, name: &str) -> Option<&crate::stats::ModelStats> {
        let k = self.endpoints.iter().position(|e| e.name == name)?;
        self.stats.get(k)
    }

    /// The `model_repository` extension's index: every served model,
    /// `(name, ready)`, version "1".
    pub(crate) fn index(&self) -> Vec<(String, bool)> {
        self.endpoints
            .iter()
            .map(|e| (e.name.clone(), readiness(&e.runner).0))
            .collect()
    }

    /// A repository load of model `name`: served already (a no-op), or
    /// refused by name.
    pub(crate) fn load(&self, name: &str) -> Result<(), String> {
        match self.endpoint(name) {
            Some(_) => Ok(()),
            None => Err(format!(
                "laned serves the models of its spec; {name:?} is not one (the models are {})",
                self.endpoints
                    .iter()
                    .map(|e| e.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// A repository unload of model `name`: refused by name.
    pub(crate) fn unload(&self, name: &str) -> String {
        format!("unloading {name:?} refused: models are fixed at start (laned serves the models of its spec)")
    }

    /// Every served model's statistics as Triton's JSON, or model `name`'s
    /// only (`None` where it is not served).
    pub(crate) fn stats_json(&self, name: Option<&str>) -> Option<serde_json::Value> {
        let models: Vec<serde_json::Value> = self
            .endpoints
            .iter()
            .zip(self.stats.iter())
            .filter(|(e, _)| name.is_none_or(|n| n == e.name))
            .map(|(e, s)| s.json(&e.name))
            .collect();
        if name.is_some() && models.is_empty() {
            return None;
        }
        Some(serde_json::json!({ "model_stats": models }))
    }
}

/// One runner's readiness line.
pub(crate) fn readiness(runner: &LanedRunner) -> (bool, String) {
    let capacity = runner.capacity();
    let line = format!(
        "accepting {} lanes_free {} spawners_waiting {}\n",
        capacity.accepting, capacity.lanes_free, capacity.spawners_waiting
    );
    (capacity.is_ready(), line)
}
