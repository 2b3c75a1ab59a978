//! The turn policy as text and as serde data: one syntax, read by
//! `FromStr` and serde and written by `Display` and serde, and one
//! validation ([`TurnPolicy::check`]) behind every way a policy arrives
//! (text, serde, a config, `LanedRunner::set_policy`), so each refuses
//! the same policies with the same error.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};

use crate::policy::TurnPolicy;

/// A turn policy refused: as text (`str::parse::<TurnPolicy>`), through
/// serde, in a [`RunnerConfig`](crate::RunnerConfig) or by
/// [`LanedRunner::set_policy`](crate::LanedRunner::set_policy). Names the
/// policy as it was given and why it was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    input: String,
    why: String,
}

/// The name [`PolicyError`] had when only text was checked.
pub type ParsePolicyError = PolicyError;

impl PolicyError {
    pub(crate) fn new(input: impl Into<String>, why: impl Into<String>) -> PolicyError {
        PolicyError {
            input: input.into(),
            why: why.into(),
        }
    }

    /// The policy refused, as it was given (its text, or as `Display`
    /// writes it).
    pub fn input(&self) -> &str {
        &self.input
    }
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "policy {:?}: {}", self.input, self.why)
    }
}

impl std::error::Error for PolicyError {}

impl FromStr for TurnPolicy {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<TurnPolicy, PolicyError> {
        let refuse = |why: String| PolicyError::new(s, why);
        let (name, arg) = match s.trim().split_once(':') {
            Some((name, arg)) => (name.trim(), Some(arg.trim())),
            None => (s.trim(), None),
        };
        let us = || -> Result<u64, PolicyError> {
            let arg = arg.ok_or_else(|| refuse(format!("expected {name}:<microseconds>")))?;
            arg.parse::<u64>()
                .map_err(|_| refuse(format!("{arg:?} is not a whole number of microseconds")))
        };
        let policy = match name {
            "immediate" if arg.is_none() => TurnPolicy::Immediate,
            "immediate" => return Err(refuse("immediate takes no value".into())),
            "linger" => TurnPolicy::Linger { us: us()? },
            "budget" | "latency_budget" => TurnPolicy::LatencyBudget { us: us()? },
            "tick" => TurnPolicy::Tick { period_us: us()? },
            _ => {
                return Err(refuse(
                    "unknown policy name; expected immediate, linger:<us>, budget:<us> or tick:<us>".into(),
                ))
            }
        };
        policy.check_as(s)?;
        Ok(policy)
    }
}

impl fmt::Display for TurnPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TurnPolicy::Immediate => f.write_str("immediate"),
            TurnPolicy::Linger { us } => write!(f, "linger:{us}"),
            TurnPolicy::LatencyBudget { us } => write!(f, "budget:{us}"),
            TurnPolicy::Tick { period_us } => write!(f, "tick:{period_us}"),
        }
    }
}

impl From<TurnPolicy> for String {
    fn from(policy: TurnPolicy) -> String {
        policy.to_string()
    }
}

/// serde reads the text, or the table form of earlier configs
/// (`{ kind = "linger", us = 500 }`), each refusal naming the field or the
/// kind at fault; then the one check.
impl<'de> Deserialize<'de> for TurnPolicy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<TurnPolicy, D::Error> {
        d.deserialize_any(PolicyVisitor)
    }
}

struct PolicyVisitor;

/// The table form's kinds, as serde names them in a refusal.
const KINDS: &[&str] = &["immediate", "linger", "latency_budget", "tick"];

impl<'de> Visitor<'de> for PolicyVisitor {
    type Value = TurnPolicy;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(
            "a turn policy: \"immediate\", \"linger:<us>\", \"budget:<us>\", \"tick:<us>\", or a table with a kind",
        )
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<TurnPolicy, E> {
        text.parse().map_err(E::custom)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TurnPolicy, A::Error> {
        let (mut kind, mut us, mut period_us) = (None::<String>, None::<u64>, None::<u64>);
        while let Some(key) = map.next_key::<String>()? {
            let once = |seen: bool| {
                if seen {
                    Err(de::Error::duplicate_field(field(&key)))
                } else {
                    Ok(())
                }
            };
            match key.as_str() {
                "kind" => {
                    once(kind.is_some())?;
                    kind = Some(map.next_value()?);
                }
                "us" => {
                    once(us.is_some())?;
                    us = Some(map.next_value()?);
                }
                "period_us" => {
                    once(period_us.is_some())?;
                    period_us = Some(map.next_value()?);
                }
                other => return Err(de::Error::unknown_field(other, &["kind", "us", "period_us"])),
            }
        }
        let kind = kind.ok_or_else(|| de::Error::missing_field("kind"))?;
        // A field of another kind is refused, naming it: a table that
        // says more than its kind reads is a mistake, not a default.
        let none = |name: &'static str, value: Option<u64>, fields: &'static [&'static str]| match value {
            Some(_) => Err(de::Error::unknown_field(name, fields)),
            None => Ok(()),
        };
        let policy = match kind.as_str() {
            "immediate" => {
                none("us", us, &["kind"])?;
                none("period_us", period_us, &["kind"])?;
                TurnPolicy::Immediate
            }
            "linger" | "latency_budget" | "budget" => {
                none("period_us", period_us, &["kind", "us"])?;
                let us = us.ok_or_else(|| de::Error::missing_field("us"))?;
                if kind == "linger" {
                    TurnPolicy::Linger { us }
                } else {
                    TurnPolicy::LatencyBudget { us }
                }
            }
            "tick" => {
                none("us", us, &["kind", "period_us"])?;
                TurnPolicy::Tick {
                    period_us: period_us.ok_or_else(|| de::Error::missing_field("period_us"))?,
                }
            }
            other => return Err(de::Error::unknown_variant(other, KINDS)),
        };
        policy.check().map_err(de::Error::custom)?;
        Ok(policy)
    }
}

/// A table key as serde's errors want it (`'static`).
fn field(key: &str) -> &'static str {
    match key {
        "kind" => "kind",
        "us" => "us",
        _ => "period_us",
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Every policy written and read back is itself, as text and through
    /// serde; the table form still reads; bad text is refused naming it.
    #[test]
    fn a_policy_reads_back_as_written() {
        for policy in [
            TurnPolicy::Immediate,
            TurnPolicy::Linger { us: 500 },
            TurnPolicy::LatencyBudget { us: 20_000 },
            TurnPolicy::Tick { period_us: 10_000 },
        ] {
            let text = policy.to_string();
            assert_eq!(text.parse::<TurnPolicy>(), Ok(policy), "{text}");
            let json = serde_json::to_string(&policy).unwrap();
            assert_eq!(json, format!("{text:?}"));
            assert_eq!(serde_json::from_str::<TurnPolicy>(&json).unwrap(), policy);
        }
        let table: TurnPolicy = serde_json::from_str(r#"{ "kind": "linger", "us": 300 }"#).unwrap();
        assert_eq!(table, TurnPolicy::Linger { us: 300 });
        assert_eq!("latency_budget: 7".parse(), Ok(TurnPolicy::LatencyBudget { us: 7 }));
        for bad in ["soon", "linger", "linger:fast", "immediate:3", "budget:-1"] {
            let e = bad.parse::<TurnPolicy>().unwrap_err();
            assert_eq!(e.input(), bad);
            assert!(e.to_string().starts_with(&format!("policy {bad:?}: ")), "{e}");
        }
        assert!(serde_json::from_str::<TurnPolicy>(r#""soon""#).is_err());
    }
}
