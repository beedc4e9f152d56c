//! Creating the unix socket safely: parent directory created if missing, a
//! stale socket replaced only if nothing listens on it, anything else at
//! the path refused, and the socket made 0600 before it accepts a single
//! connection.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener as StdListener, UnixStream};
use std::path::{Path, PathBuf};

use socket2::{Domain, SockAddr, Socket, Type};

/// Why the socket could not be created.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    /// Another process accepts connections on the socket.
    #[error("{0}: another process is already listening on this socket")]
    InUse(PathBuf),
    /// The path exists and is not a socket; we never delete such a file.
    #[error("{0}: exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    /// A system call failed.
    #[error("{path}: {op}: {source}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// What we were doing.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path, op: &'static str) -> impl FnOnce(io::Error) -> SocketError + use<> {
    let path = path.to_owned();
    move |source| SocketError::Io { path, op, source }
}

/// A bound socket file; [`remove`](Self::remove) deletes it only if it is
/// still the one we created.
#[derive(Debug)]
pub struct SocketFile {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl SocketFile {
    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Removes the socket unless something else replaced it meanwhile.
    pub fn remove(self) {
        if let Ok(meta) = std::fs::symlink_metadata(&self.path)
            && meta.file_type().is_socket()
            && meta.dev() == self.dev
            && meta.ino() == self.ino
        {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Clears a stale socket at `path`: absent → nothing; a socket nobody
/// listens on → removed; a live socket or a non-socket → error.
pub fn clear_stale(path: &Path) -> Result<(), SocketError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(path, "stat")(e)),
    };
    if !meta.file_type().is_socket() {
        return Err(SocketError::NotASocket(path.to_owned()));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(SocketError::InUse(path.to_owned())),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path).map_err(io_err(path, "remove stale socket"))
        }
        Err(e) => Err(io_err(path, "probe existing socket")(e)),
    }
}

/// Binds a listening unix socket at `path` with mode 0600.
///
/// The socket is bound, chmod-ed and only then put into listening state:
/// before `listen` nobody can connect, so there is no window with looser
/// permissions, and unlike changing the umask this does not affect other
/// threads of the process.
pub fn bind(path: &Path) -> Result<(StdListener, SocketFile), SocketError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io_err(path, "create parent directory"))?;
    }
    clear_stale(path)?;
    let socket =
        Socket::new(Domain::UNIX, Type::STREAM, None).map_err(io_err(path, "create socket"))?;
    let addr = SockAddr::unix(path).map_err(io_err(path, "socket address"))?;
    socket.bind(&addr).map_err(io_err(path, "bind"))?;
    let file = {
        let meta = std::fs::symlink_metadata(path).map_err(io_err(path, "stat bound socket"))?;
        SocketFile {
            path: path.to_owned(),
            dev: meta.dev(),
            ino: meta.ino(),
        }
    };
    let restrict = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io_err(path, "chmod 0600"))
        .and_then(|()| socket.listen(1024).map_err(io_err(path, "listen")))
        .and_then(|()| {
            socket
                .set_nonblocking(true)
                .map_err(io_err(path, "set non-blocking"))
        });
    if let Err(e) = restrict {
        file.remove();
        return Err(e);
    }
    Ok((socket.into(), file))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_0600_in_a_new_directory_and_removes_only_its_own_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/dir/csi.sock");
        let (listener, file) = bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(matches!(bind(&path), Err(SocketError::InUse(_))));
        drop(listener);
        // Replaced by someone else: our remove must leave it alone.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"x").unwrap();
        file.remove();
        assert!(path.exists());
    }

    #[test]
    fn stale_sockets_are_replaced_and_other_files_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        drop(StdListener::bind(&path).unwrap());
        assert!(path.exists());
        let (_l, file) = bind(&path).unwrap();
        file.remove();
        assert!(!path.exists());

        std::fs::write(&path, b"not a socket").unwrap();
        assert!(matches!(bind(&path), Err(SocketError::NotASocket(_))));
        assert_eq!(std::fs::read(&path).unwrap(), b"not a socket");

        let link = dir.path().join("link.sock");
        std::os::unix::fs::symlink(dir.path(), &link).unwrap();
        assert!(matches!(bind(&link), Err(SocketError::NotASocket(_))));
    }
}
