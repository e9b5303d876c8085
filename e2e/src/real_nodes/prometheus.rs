//! The Prometheus `hack/prometheus/start.sh` runs on the real-node cluster, asked through its HTTP
//! API as a dashboard or `promtool query` would ask it.

use std::collections::BTreeMap;

use anyhow::{Context, bail, ensure};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::RealNodes;

/// One series of a query's answer: its labels and its value.
pub type Sample = (BTreeMap<String, String>, f64);

/// The cluster's Prometheus.
#[derive(Clone, Debug)]
pub struct Prometheus {
    /// `host:port`.
    address: String,
}

impl RealNodes {
    /// The Prometheus the real-node test started (its address in `prometheus-url` of the cluster
    /// folder).
    pub fn prometheus(&self) -> anyhow::Result<Prometheus> {
        let file = self.env.cluster_dir.join("prometheus-url");
        let url = std::fs::read_to_string(&file).with_context(|| {
            format!(
                "{}: no Prometheus on this cluster (hack/prometheus/start.sh)",
                file.display()
            )
        })?;
        let address = url.trim().trim_start_matches("http://").to_owned();
        Ok(Prometheus { address })
    }
}

impl Prometheus {
    /// `GET path?query` of the HTTP API; the answer's `data`, or an error with what it said.
    pub async fn get(&self, path: &str, query: &[(&str, &str)]) -> anyhow::Result<Value> {
        let query: Vec<String> = query
            .iter()
            .map(|(k, v)| format!("{k}={}", percent_encode(v)))
            .collect();
        let target = if query.is_empty() {
            path.to_owned()
        } else {
            format!("{path}?{}", query.join("&"))
        };
        let mut stream = TcpStream::connect(&self.address)
            .await
            .with_context(|| format!("connecting to Prometheus at {}", self.address))?;
        let request = format!(
            "GET {target} HTTP/1.0\r\nHost: {}\r\nAccept: application/json\r\n\r\n",
            self.address
        );
        stream.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        let answer = String::from_utf8_lossy(&answer);
        let (head, body) = answer
            .split_once("\r\n\r\n")
            .with_context(|| format!("GET {target}: no HTTP answer: {answer:?}"))?;
        let json: Value = serde_json::from_str(body).with_context(|| {
            format!(
                "GET {target}: {}: {body}",
                head.lines().next().unwrap_or_default()
            )
        })?;
        ensure!(json["status"] == "success", "GET {target}: {json}");
        Ok(json["data"].clone())
    }

    /// The instant vector `promql` evaluates to now.
    pub async fn query(&self, promql: &str) -> anyhow::Result<Vec<Sample>> {
        let data = self.get("/api/v1/query", &[("query", promql)]).await?;
        let Some(result) = data["result"].as_array() else {
            bail!("{promql}: not an instant vector: {data}");
        };
        Ok(result
            .iter()
            .map(|s| {
                let labels = s["metric"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect();
                let value = s["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(f64::NAN);
                (labels, value)
            })
            .collect())
    }

    /// How many series `promql` gives as a range query over the last `span` (15 s steps), as a
    /// dashboard panel over that time range asks it.
    pub async fn range_series(
        &self,
        promql: &str,
        span: std::time::Duration,
    ) -> anyhow::Result<usize> {
        let end = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs();
        let start = end.saturating_sub(span.as_secs());
        let (start, end) = (start.to_string(), end.to_string());
        let query = [
            ("query", promql),
            ("start", start.as_str()),
            ("end", end.as_str()),
            ("step", "15"),
        ];
        let data = self.get("/api/v1/query_range", &query).await?;
        Ok(data["result"].as_array().map_or(0, Vec::len))
    }

    /// The labels of each firing instance of alert `name`.
    pub async fn firing(&self, name: &str) -> anyhow::Result<Vec<BTreeMap<String, String>>> {
        let data = self.get("/api/v1/alerts", &[]).await?;
        Ok(data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|a| a["labels"]["alertname"] == name && a["state"] == "firing")
            .map(|a| {
                a["labels"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .collect())
    }

    /// Waits until alert `name` fires (`true`) or no longer fires (`false`) for node `node`, at most
    /// `timeout`.
    pub async fn wait_alert(
        &self,
        name: &str,
        node: &str,
        fires: bool,
        timeout: std::time::Duration,
    ) -> anyhow::Result<()> {
        let what = if fires { "to fire" } else { "to resolve" };
        crate::eventually(
            timeout,
            &format!("alert {name} for node {node} {what}"),
            || async {
                let firing = self.firing(name).await?;
                let here = firing
                    .iter()
                    .any(|l| l.get("node").map(String::as_str) == Some(node));
                Ok((here == fires).then_some(()))
            },
        )
        .await
    }
}

/// `text` with every byte but the URL-unreserved ones percent-encoded.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            super::percent_encode(r#"up{job="a/b"} > 0"#),
            "up%7Bjob%3D%22a%2Fb%22%7D%20%3E%200"
        );
    }
}
