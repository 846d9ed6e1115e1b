//! TLS to PostgreSQL. `sslmode=require` in the database URL encrypts every connection of the
//! pool (OpenSSL). The server's certificate is verified, chain and host name, against the CA
//! file named by `PGSSLROOTCERT` (libpq's variable) when it is set; without it the connection is
//! encrypted but the server is not authenticated, as libpq does for `require` without a root
//! certificate.
//!
//! Invariant: `prefer` (the default) and `disable` connect in plain text, as before TLS existed
//! here: a server that offers TLS is not negotiated with unless the URL asks for it.

use std::path::{Path, PathBuf};

use deadpool_postgres::{Manager, ManagerConfig};
use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
use postgres_openssl::MakeTlsConnector;
use tokio_postgres::config::SslMode;
use tokio_postgres::NoTls;

use super::error::DbError;

/// The environment variable naming the CA certificates (PEM) that verify the server.
pub(crate) const ROOT_CERT_VAR: &str = "PGSSLROOTCERT";

/// A connection manager for `config`: TLS when its `sslmode` is `require`, plain otherwise.
pub(crate) fn manager(
    config: tokio_postgres::Config,
    mc: ManagerConfig,
) -> Result<Manager, DbError> {
    if config.get_ssl_mode() != SslMode::Require {
        return Ok(Manager::from_config(config, NoTls, mc));
    }
    let root = std::env::var_os(ROOT_CERT_VAR)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from);
    Ok(Manager::from_config(
        config,
        connector(root.as_deref())?,
        mc,
    ))
}

/// An OpenSSL connector: verifying against `root` (a PEM file of CA certificates), or, without
/// it, encrypting only.
pub(crate) fn connector(root: Option<&Path>) -> Result<MakeTlsConnector, DbError> {
    let tls = |e: openssl::error::ErrorStack| DbError::Tls(e.to_string());
    let mut builder = SslConnector::builder(SslMethod::tls()).map_err(tls)?;
    match root {
        Some(path) => builder
            .set_ca_file(path)
            .map_err(|e| DbError::Tls(format!("{ROOT_CERT_VAR}={}: {e}", path.display())))?,
        None => builder.set_verify(SslVerifyMode::NONE),
    }
    let mut connector = MakeTlsConnector::new(builder.build());
    if root.is_none() {
        connector.set_callback(|config, _host| {
            config.set_verify_hostname(false);
            Ok(())
        });
    }
    Ok(connector)
}
