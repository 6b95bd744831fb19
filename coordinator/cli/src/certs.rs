//! `longhaul certs`: a certificate authority for one cluster and the
//! certificates its parties present, named as the authorization boundary
//! reads them ([`longhaul_core::identity`]): `replica.longhaul` for a
//! replica (beside the hosts it is reached at), `operator.longhaul` for an
//! operator, `<site>.site.longhaul` for a site's agent.
//!
//! Keys are written `0600` and certificates `0644`, into a directory made
//! `0700` when this command creates it. Nothing is overwritten: a command
//! whose file exists changes nothing and exits 2. ECDSA P-256 keys (rcgen's
//! default, what rustls prefers).

use std::fs::OpenOptions;
use std::io::Write as _;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow};
use clap::{Args, Subcommand, ValueEnum};
use longhaul_core::identity;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use super::Failure;

/// The CA's files in the directory.
const CA_CERT: &str = "ca.pem";
const CA_KEY: &str = "ca.key";

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Make the cluster's certificate authority: DIR/ca.pem (give it to
    /// every party) and DIR/ca.key (keep it offline: it signs every
    /// identity). Refuses if either exists.
    Init(InitArgs),
    /// Issue a certificate signed by the CA in DIR: DIR/NAME.pem and
    /// DIR/NAME.key. `replica` names replica.longhaul and the hosts it is
    /// reached at (--host; localhost and 127.0.0.1 when none is given);
    /// `operator` names operator.longhaul; `site` names NAME.site.longhaul
    /// (NAME is the site id). Refuses if either file exists.
    Issue(IssueArgs),
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// Where the files go (created, 0700, if missing).
    #[arg(long, default_value = "certs")]
    pub dir: PathBuf,
    /// The CA's common name.
    #[arg(long, default_value = "longhaul cluster CA")]
    pub common_name: String,
    /// Validity in days.
    #[arg(long, default_value_t = 3650, value_parser = clap::value_parser!(u32).range(1..=36500))]
    pub days: u32,
}

/// What a certificate lets its holder be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Role {
    Replica,
    Operator,
    Site,
}

#[derive(Debug, Args)]
pub struct IssueArgs {
    pub role: Role,
    /// The holder's name: the file stem (NAME.pem, NAME.key), and for
    /// `site` the site id. 1 to 63 characters of a-z, 0-9, '-' or '_'.
    pub name: String,
    /// The CA's directory, where the files go.
    #[arg(long, default_value = "certs")]
    pub dir: PathBuf,
    /// A DNS name or IP address the holder is reached at (repeatable): a
    /// replica's listen host, a site agent's data address host.
    #[arg(long = "host", value_name = "HOST")]
    pub hosts: Vec<String>,
    /// Validity in days.
    #[arg(long, default_value_t = 825, value_parser = clap::value_parser!(u32).range(1..=36500))]
    pub days: u32,
}

pub fn certs(command: &CertsCommand, out: &mut dyn std::io::Write) -> Result<(), Failure> {
    match command {
        CertsCommand::Init(args) => init(args, out),
        CertsCommand::Issue(args) => issue(args, out),
    }
}

fn init(args: &InitArgs, out: &mut dyn std::io::Write) -> Result<(), Failure> {
    if args.common_name.trim().is_empty() || args.common_name.len() > 64 {
        return Err(invalid("--common-name: 1 to 64 characters"));
    }
    let (cert_path, key_path) = (args.dir.join(CA_CERT), args.dir.join(CA_KEY));
    refuse_existing(&[&cert_path, &key_path])?;
    let key = KeyPair::generate().context("cannot generate the CA key")?;
    let mut params = CertificateParams::new(Vec::<String>::new()).context("CA parameters")?;
    params.distinguished_name = name(&args.common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity(&mut params, args.days)?;
    let cert = params
        .self_signed(&key)
        .context("cannot self-sign the CA")?;
    write_pair(
        &args.dir,
        (&cert_path, &cert.pem()),
        (&key_path, &key.serialize_pem()),
    )?;
    writeln!(
        out,
        "CA {:?} valid {} days: {} (share it) and {} (0600; keep it safe, it signs every identity)",
        args.common_name,
        args.days,
        cert_path.display(),
        key_path.display()
    )?;
    Ok(())
}

fn issue(args: &IssueArgs, out: &mut dyn std::io::Write) -> Result<(), Failure> {
    let mut violations = Vec::new();
    longhaul_core::config::check_id(
        &longhaul_core::config::FieldPath::root(),
        &args.name,
        &mut violations,
    );
    if let Some(violation) = violations.first() {
        return Err(invalid(&format!("NAME: {}", violation.message)));
    }
    let (ca_cert_path, ca_key_path) = (args.dir.join(CA_CERT), args.dir.join(CA_KEY));
    let ca_pem = std::fs::read_to_string(&ca_cert_path).map_err(|e| {
        invalid(&format!(
            "--dir: cannot read {} ({e}): make the CA first with `longhaul certs init --dir {}`",
            ca_cert_path.display(),
            args.dir.display()
        ))
    })?;
    let ca_key_pem = std::fs::read_to_string(&ca_key_path).map_err(|e| {
        invalid(&format!(
            "--dir: cannot read {} ({e})",
            ca_key_path.display()
        ))
    })?;
    let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(|e| {
        invalid(&format!(
            "{}: not a private key ({e})",
            ca_key_path.display()
        ))
    })?;
    let ca_not_after = ca_not_after(&ca_pem).map_err(|e| {
        invalid(&format!(
            "{}: not a certificate ({e})",
            ca_cert_path.display()
        ))
    })?;
    let now = time::OffsetDateTime::now_utc();
    if ca_not_after <= now {
        return Err(invalid(&format!(
            "{}: the CA expired on {}; make a new one with `longhaul certs init` (and reissue every certificate)",
            ca_cert_path.display(),
            ca_not_after.date()
        )));
    }
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(|e| {
        invalid(&format!(
            "{}: not a certificate ({e})",
            ca_cert_path.display()
        ))
    })?;

    let role_name = match args.role {
        Role::Replica => identity::REPLICA_NAME.to_string(),
        Role::Operator => identity::OPERATOR_NAME.to_string(),
        Role::Site => identity::site_dns_name(&args.name),
    };
    let mut hosts = args.hosts.clone();
    if args.role == Role::Replica && hosts.is_empty() {
        hosts = vec!["localhost".into(), "127.0.0.1".into()];
    }
    let mut sans = vec![dns(&role_name)?];
    for host in &hosts {
        // Roles come from certificate names alone: a host must not add one.
        if identity::Roles::from_dns_names([host.as_str()]) != identity::Roles::default()
            || host.ends_with(".longhaul")
        {
            return Err(invalid(&format!(
                "--host {}: a name under .longhaul is a role, not a host (the command gives the role)",
                longhaul_core::limits::quote(host)
            )));
        }
        let san = match host.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => {
                if host.is_empty()
                    || host.len() > 253
                    || !host
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
                {
                    return Err(invalid(&format!(
                        "--host {}: not an IP address or a DNS name",
                        longhaul_core::limits::quote(host)
                    )));
                }
                dns(host)?
            }
        };
        sans.push(san);
    }
    let cert_path = args.dir.join(format!("{}.pem", args.name));
    let key_path = args.dir.join(format!("{}.key", args.name));
    refuse_existing(&[&cert_path, &key_path])?;

    let key = KeyPair::generate().context("cannot generate a key")?;
    let mut params = CertificateParams::default();
    params.distinguished_name = name(&args.name);
    params.subject_alt_names = sans;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = match args.role {
        // Replicas serve and dial each other; agents dial the coordinator
        // and serve each other's QUIC.
        Role::Replica | Role::Site => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        Role::Operator => vec![ExtendedKeyUsagePurpose::ClientAuth],
    };
    params.use_authority_key_identifier_extension = true;
    validity(&mut params, args.days)?;
    // A certificate cannot outlive its signer: a verifier refuses the chain
    // once the CA has expired, whatever the leaf says.
    let clamped = params.not_after > ca_not_after;
    if clamped {
        params.not_after = ca_not_after;
    }
    let cert = params
        .signed_by(&key, &issuer)
        .context("cannot sign the certificate")?;
    write_pair(
        &args.dir,
        (&cert_path, &cert.pem()),
        (&key_path, &key.serialize_pem()),
    )?;
    let mut names = vec![role_name];
    names.extend(hosts);
    let valid = if clamped {
        format!(
            "valid until {} (the CA's expiry, shorter than the {} days asked for)",
            ca_not_after.date(),
            args.days
        )
    } else {
        format!("valid {} days", args.days)
    };
    writeln!(
        out,
        "{} certificate for {}: {} and {} (0600), names {}, {valid}",
        format!("{:?}", args.role).to_lowercase(),
        args.name,
        cert_path.display(),
        key_path.display(),
        names.join(", "),
    )?;
    Ok(())
}

fn invalid(message: &str) -> Failure {
    Failure::Unsatisfiable(anyhow!("{message}"))
}

fn name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

fn dns(name: &str) -> Result<SanType, Failure> {
    Ok(SanType::DnsName(name.to_string().try_into().map_err(
        |_| invalid(&format!("{name}: not a DNS name")),
    )?))
}

/// When the CA certificate in `pem` expires.
fn ca_not_after(pem: &str) -> Result<time::OffsetDateTime, String> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| e.to_string())?;
    let cert = pem.parse_x509().map_err(|e| e.to_string())?;
    Ok(cert.validity().not_after.to_datetime())
}

/// Valid from an hour ago (clocks differ) for `days`.
fn validity(params: &mut CertificateParams, days: u32) -> Result<(), Failure> {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(i64::from(days));
    Ok(())
}

fn refuse_existing(paths: &[&Path]) -> Result<(), Failure> {
    for path in paths {
        if path.exists() {
            return Err(invalid(&format!(
                "{} exists: not overwritten (remove it, or choose another --dir or NAME)",
                path.display()
            )));
        }
    }
    Ok(())
}

/// Writes a certificate (0644) and its key (0600), each created anew; if
/// either cannot be written, neither is left behind.
fn write_pair(dir: &Path, cert: (&Path, &str), key: (&Path, &str)) -> Result<(), Failure> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("--dir: cannot create {}", dir.display()))?;
    }
    // `create_new`: a file that appeared since the check is refused, not
    // overwritten; a file this call created is removed if anything after
    // its creation fails, so neither is left alone or half written.
    let write = |path: &Path, text: &str, mode: u32| -> std::io::Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)?;
        let written = file
            .write_all(text.as_bytes())
            .and_then(|()| file.sync_all());
        if written.is_err() {
            let _ = std::fs::remove_file(path);
        }
        written
    };
    write(key.0, key.1, 0o600).with_context(|| format!("cannot write {}", key.0.display()))?;
    if let Err(error) = write(cert.0, cert.1, 0o644) {
        let _ = std::fs::remove_file(key.0);
        return Err(anyhow::Error::new(error)
            .context(format!("cannot write {}", cert.0.display()))
            .into());
    }
    Ok(())
}
