//! The turn policy as text: one syntax, read by `FromStr` and serde and
//! written by `Display` and serde, so a policy in a config file, a flag or
//! an environment variable reads the same.

use std::fmt;
use std::str::FromStr;

use serde::Deserialize;

use crate::policy::TurnPolicy;

/// A policy's text refused by `str::parse::<TurnPolicy>`: the text, and
/// what it should have been.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsePolicyError {
    input: String,
    why: String,
}

impl ParsePolicyError {
    /// The text refused.
    pub fn input(&self) -> &str {
        &self.input
    }
}

impl fmt::Display for ParsePolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "policy {:?}: {}", self.input, self.why)
    }
}

impl std::error::Error for ParsePolicyError {}

impl FromStr for TurnPolicy {
    type Err = ParsePolicyError;

    fn from_str(s: &str) -> Result<TurnPolicy, ParsePolicyError> {
        let refuse = |why: String| ParsePolicyError {
            input: s.to_string(),
            why,
        };
        let (name, arg) = match s.trim().split_once(':') {
            Some((name, arg)) => (name.trim(), Some(arg.trim())),
            None => (s.trim(), None),
        };
        let us = || -> Result<u64, ParsePolicyError> {
            let arg = arg.ok_or_else(|| refuse(format!("expected {name}:<microseconds>")))?;
            arg.parse::<u64>()
                .map_err(|_| refuse(format!("{arg:?} is not a whole number of microseconds")))
        };
        match name {
            "immediate" if arg.is_none() => Ok(TurnPolicy::Immediate),
            "immediate" => Err(refuse("immediate takes no value".into())),
            "linger" => Ok(TurnPolicy::Linger { us: us()? }),
            "budget" | "latency_budget" => Ok(TurnPolicy::LatencyBudget { us: us()? }),
            "tick" => Ok(TurnPolicy::Tick {
                period_us: us()?.max(1),
            }),
            _ => Err(refuse(
                "unknown policy name; expected immediate, linger:<us>, budget:<us> or tick:<us>".into(),
            )),
        }
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

/// What serde reads: the text, or the table form of earlier configs.
#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum Written {
    Text(String),
    Table(Table),
}

#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum Table {
    Immediate,
    Linger { us: u64 },
    LatencyBudget { us: u64 },
    Tick { period_us: u64 },
}

impl TryFrom<Written> for TurnPolicy {
    type Error = ParsePolicyError;

    fn try_from(written: Written) -> Result<TurnPolicy, ParsePolicyError> {
        Ok(match written {
            Written::Text(text) => text.parse()?,
            Written::Table(Table::Immediate) => TurnPolicy::Immediate,
            Written::Table(Table::Linger { us }) => TurnPolicy::Linger { us },
            Written::Table(Table::LatencyBudget { us }) => TurnPolicy::LatencyBudget { us },
            Written::Table(Table::Tick { period_us }) => TurnPolicy::Tick { period_us },
        })
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
