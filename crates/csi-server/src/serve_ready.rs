//! Serving while the driver's start-up work (a node's restore) runs.

use std::fmt::Display;

use crate::{Server, ServerError};

/// Why [`Server::serve_ready_after`] ended with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError<E: Display> {
    /// The server could not start, or stopped with an error.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// The start-up work failed.
    #[error("{0}")]
    Startup(E),
}

impl Server {
    /// Serves at once and reports ready (Probe) only when `startup` has
    /// succeeded, e.g. a node service's `restore_in_background`: meanwhile
    /// the CO sees a live plugin that is not ready yet. Build the server
    /// with a [`Readiness`](crate::Readiness) handle, or it reports ready as
    /// soon as it listens. Ends at SIGTERM or SIGINT, or at the first error.
    ///
    /// ```no_run
    /// # async fn run(builder: csi_server::ServerBuilder) -> Result<(), Box<dyn std::error::Error>> {
    /// let server = builder.readiness(csi_server::Readiness::new()).build()?;
    /// let restore = async { Ok::<(), std::io::Error>(()) };
    /// server.serve_ready_after(restore).await?;
    /// # Ok(()) }
    /// ```
    pub async fn serve_ready_after<E: Display>(
        self,
        startup: impl Future<Output = Result<(), E>>,
    ) -> Result<(), ServeError<E>> {
        let readiness = self.readiness();
        let ready = async {
            startup.await.map_err(ServeError::Startup)?;
            readiness.set_ready();
            Ok(())
        };
        let serving = async { Ok(self.serve().await?) };
        tokio::try_join!(serving, ready).map(drop)
    }
}
