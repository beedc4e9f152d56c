use crate::config::{secret_kinds, secrets_file_key};
use crate::suite::{Ctx, Outcome, fail, skip};

pub(super) async fn secrets_not_in_logs(ctx: &mut Ctx) -> Outcome {
    let Some(path) = ctx.config.driver_log.clone() else {
        return skip("no driver log configured (Config::driver_log)");
    };
    let markers = ctx.config.secrets.log_markers();
    if markers.is_empty() {
        return skip("no secret value of 8 bytes or more is configured");
    }
    // Let the driver flush what it logged during the last checks.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let bytes = tokio::fs::read(&path)
        .await
        .or_else(|e| fail(format!("cannot read driver log {}: {e}", path.display())))?;
    let text = String::from_utf8_lossy(&bytes);
    for marker in &markers {
        if let Some((n, line)) = text
            .lines()
            .enumerate()
            .find(|(_, l)| l.contains(marker.as_str()))
        {
            let kinds: Vec<String> = secret_kinds()
                .filter(|k| ctx.config.secrets.get(*k).values().any(|v| v == marker))
                .map(secrets_file_key)
                .collect();
            // Never echo the secret itself into the report.
            let context: String = line
                .replace(marker.as_str(), "<SECRET>")
                .chars()
                .take(200)
                .collect();
            return fail(format!(
                "a secret value ({}) appears in the driver log {} at line {}: {context}",
                kinds.join(", "),
                path.display(),
                n + 1
            ));
        }
    }
    Ok(())
}
