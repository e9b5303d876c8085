//! The chart's Grafana dashboard (`charts/gpu-operator/dashboards/gpu-operator.json`) against the
//! cluster's Prometheus once the other scenarios ran: every panel's every query must be valid
//! PromQL and draw something over the time they took. `hack/test/real-nodes.sh` runs it after them.

use std::time::Duration;

use anyhow::ensure;
use e2e::real_nodes::{L4_NODE, OPERATOR_NS, RealNodes};
use serde_json::Value;

#[tokio::test]
#[ignore = "needs real nodes and the other scenarios run before it: make test-real-nodes runs it"]
async fn every_dashboard_panel_draws_data_after_the_scenarios() -> anyhow::Result<()> {
    let cluster = RealNodes::connect().await?;
    let prometheus = cluster.prometheus()?;
    let file = e2e::manifest_dir().join("../charts/gpu-operator/dashboards/gpu-operator.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&file)?)?;
    cluster
        .step(
            "every query of every panel of the dashboard answers, with series, over the last 30 minutes",
            L4_NODE,
            async {
                let mut empty = Vec::new();
                let mut asked = 0;
                let panels = dashboard["panels"].as_array().into_iter().flatten();
                for panel in panels.filter(|p| p["type"] != "row") {
                    for target in panel["targets"].as_array().into_iter().flatten() {
                        let expr = target["expr"]
                            .as_str()
                            .unwrap_or_default()
                            .replace("$namespace", OPERATOR_NS);
                        asked += 1;
                        let series = prometheus.range_series(&expr, Duration::from_secs(1800)).await?;
                        if series == 0 {
                            empty.push(format!("{:?}: {expr}", panel["title"]));
                        }
                    }
                }
                ensure!(asked > 0, "no panel query in {}", file.display());
                ensure!(empty.is_empty(), "panels with no data: {}", empty.join("; "));
                eprintln!("     {asked} queries, each with data");
                Ok(())
            },
        )
        .await
}
