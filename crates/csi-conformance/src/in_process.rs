//! Serving a driver in this process on a socket in a temporary directory,
//! for the fake driver and for [`run_in_process`](crate::run_in_process).

use std::time::Duration;

use csi_server::{Endpoint, ServerBuilder, ServerError};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A server running in a task; stopped when shut down or dropped.
#[derive(Debug)]
pub(crate) struct Running {
    endpoint: String,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServerError>>>,
    dir: tempfile::TempDir,
}

impl Running {
    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The temporary directory the socket is in.
    pub(crate) fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Stops serving and waits for the server task (in-flight calls
    /// included) to end.
    pub(crate) async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Serves `builder` on `dir/csi.sock` and waits until it accepts connections.
pub(crate) async fn serve(
    builder: ServerBuilder,
    dir: tempfile::TempDir,
) -> Result<Running, ServerError> {
    let socket = dir.path().join("csi.sock");
    let server = builder
        .endpoint(Endpoint::unix(&socket)?)
        .grace_period(Duration::from_secs(10))
        .build()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let mut task = tokio::spawn(server.serve_with_shutdown(async move {
        let _ = stopped.await;
    }));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::net::UnixStream::connect(&socket).await.is_err() {
        if task.is_finished() {
            // It stopped before listening: that is its error.
            return Err(match (&mut task).await {
                Ok(Err(e)) => e,
                _ => ServerError::Config("the server stopped before listening".into()),
            });
        }
        if tokio::time::Instant::now() > deadline {
            return Err(ServerError::Config(format!(
                "{} did not accept connections within 30 s",
                socket.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(Running {
        endpoint: format!("unix://{}", socket.display()),
        stop: Some(stop),
        task: Some(task),
        dir,
    })
}
