//! `csi`: a command-line client for any CSI driver.
//!
//! Poke a driver by hand (`csi identity info`, `csi controller create-volume
//! pvc-1 --size 1Gi`, ...), run the conformance suite (`csi sanity`), or
//! measure it under load (`csi bench`). The endpoint comes from `--endpoint`
//! or `CSI_ENDPOINT`.

mod args;
mod bench;
mod output;
mod sanity;

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use csi_client::{ClientOptions, CsiClient, Endpoint, UnaryRequest};
use csi_proto::methods::Method;
use csi_proto::v1::*;

use args::{CapabilityArgs, SecretArgs, SizeArgs, parse_kv, to_map};
use node::NodeCmd;
use output::Format;

/// A command-line client for CSI drivers.
#[derive(Debug, Parser)]
#[command(name = "csi", version, about)]
struct Cli {
    /// The driver's endpoint, e.g. unix:///run/csi/csi.sock.
    #[arg(
        long,
        env = "CSI_ENDPOINT",
        global = true,
        default_value = "unix:///run/csi/csi.sock"
    )]
    endpoint: String,
    /// Output format.
    #[arg(long, short, value_enum, global = true, default_value_t = Format::Human)]
    output: Format,
    /// Deadline for each call, in seconds.
    #[arg(long, global = true, default_value_t = 60)]
    timeout: u64,
    #[command(flatten)]
    secrets: SecretArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Identity service: plugin info, capabilities, probe.
    #[command(subcommand)]
    Identity(IdentityCmd),
    /// Controller service: volumes, snapshots, capacity.
    #[command(subcommand)]
    Controller(ControllerCmd),
    /// Node service: stage, publish, stats, expand, info.
    #[command(subcommand)]
    Node(NodeCmd),
    /// GroupController service: volume group snapshots.
    #[command(subcommand)]
    Group(GroupCmd),
    /// Load-test the driver and report latency percentiles.
    Bench(bench::BenchArgs),
    /// Run the conformance suite against the driver.
    Sanity(sanity::SanityArgs),
}

#[derive(Debug, Subcommand)]
enum IdentityCmd {
    /// GetPluginInfo.
    Info,
    /// GetPluginCapabilities.
    Capabilities,
    /// Probe.
    Probe,
}

#[derive(Debug, Subcommand)]
enum ControllerCmd {
    /// CreateVolume.
    CreateVolume {
        /// The volume name (the CO's idempotency key).
        name: String,
        #[command(flatten)]
        size: SizeArgs,
        #[command(flatten)]
        cap: CapabilityArgs,
        /// A creation parameter (repeatable).
        #[arg(long = "param", value_parser = parse_kv)]
        params: Vec<(String, String)>,
        /// A mutable parameter (repeatable).
        #[arg(long = "mutable-param", value_parser = parse_kv)]
        mutable_params: Vec<(String, String)>,
        /// Create from this snapshot.
        #[arg(long, conflicts_with = "from_volume")]
        from_snapshot: Option<String>,
        /// Clone this volume.
        #[arg(long)]
        from_volume: Option<String>,
    },
    /// DeleteVolume.
    DeleteVolume {
        /// The volume id.
        volume_id: String,
    },
    /// ListVolumes (follows next_token unless --max-entries is given).
    ListVolumes {
        /// Page size; with it only one page is fetched.
        #[arg(long)]
        max_entries: Option<i32>,
        /// Token from a previous page.
        #[arg(long, default_value = "")]
        starting_token: String,
    },
    /// ControllerGetVolume.
    GetVolume {
        /// The volume id.
        volume_id: String,
    },
    /// ControllerExpandVolume.
    ExpandVolume {
        /// The volume id.
        volume_id: String,
        #[command(flatten)]
        size: SizeArgs,
        #[command(flatten)]
        cap: CapabilityArgs,
    },
    /// ControllerPublishVolume.
    PublishVolume {
        /// The volume id.
        volume_id: String,
        /// The node to publish to.
        #[arg(long)]
        node: String,
        /// Publish read-only.
        #[arg(long)]
        readonly: bool,
        #[command(flatten)]
        cap: CapabilityArgs,
    },
    /// ControllerUnpublishVolume.
    UnpublishVolume {
        /// The volume id.
        volume_id: String,
        /// The node (empty: all nodes).
        #[arg(long, default_value = "")]
        node: String,
    },
    /// ValidateVolumeCapabilities.
    ValidateCapabilities {
        /// The volume id.
        volume_id: String,
        #[command(flatten)]
        cap: CapabilityArgs,
    },
    /// ControllerModifyVolume.
    ModifyVolume {
        /// The volume id.
        volume_id: String,
        /// A mutable parameter (repeatable).
        #[arg(long = "mutable-param", value_parser = parse_kv, required = true)]
        mutable_params: Vec<(String, String)>,
    },
    /// GetCapacity.
    Capacity {
        /// A parameter (repeatable).
        #[arg(long = "param", value_parser = parse_kv)]
        params: Vec<(String, String)>,
    },
    /// ControllerGetCapabilities.
    Capabilities,
    /// CreateSnapshot.
    CreateSnapshot {
        /// The snapshot name.
        name: String,
        /// The volume to snapshot.
        #[arg(long)]
        source: String,
        /// A parameter (repeatable).
        #[arg(long = "param", value_parser = parse_kv)]
        params: Vec<(String, String)>,
    },
    /// DeleteSnapshot.
    DeleteSnapshot {
        /// The snapshot id.
        snapshot_id: String,
    },
    /// ListSnapshots.
    ListSnapshots {
        /// Only this snapshot.
        #[arg(long, default_value = "")]
        snapshot_id: String,
        /// Only snapshots of this volume.
        #[arg(long, default_value = "")]
        source_volume_id: String,
        /// Page size.
        #[arg(long, default_value_t = 0)]
        max_entries: i32,
        /// Token from a previous page.
        #[arg(long, default_value = "")]
        starting_token: String,
    },
    /// GetSnapshot.
    GetSnapshot {
        /// The snapshot id.
        snapshot_id: String,
    },
}

#[derive(Debug, Subcommand)]
enum GroupCmd {
    /// GroupControllerGetCapabilities.
    Capabilities,
    /// CreateVolumeGroupSnapshot.
    Create {
        /// The group snapshot name.
        name: String,
        /// A source volume (repeat for each).
        #[arg(long = "source", required = true)]
        sources: Vec<String>,
        /// A parameter (repeatable).
        #[arg(long = "param", value_parser = parse_kv)]
        params: Vec<(String, String)>,
    },
    /// DeleteVolumeGroupSnapshot.
    Delete {
        /// The group snapshot id.
        group_snapshot_id: String,
        /// The member snapshot ids, as the spec asks the CO to send them.
        #[arg(long = "snapshot-id")]
        snapshot_ids: Vec<String>,
    },
    /// GetVolumeGroupSnapshot.
    Get {
        /// The group snapshot id.
        group_snapshot_id: String,
        /// The member snapshot ids.
        #[arg(long = "snapshot-id")]
        snapshot_ids: Vec<String>,
    },
}

/// A failed command: the message and the process exit code.
struct Failure(String);

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Self {
        Failure(format!("{:?}: {}", s.code(), s.message()))
    }
}

/// Sends one request and prints the answer, rendered by the response
/// message's name from the method table.
macro_rules! show {
    ($out:expr, $client:expr, $req:expr) => {
        show($out, $client, $req).await?
    };
}

async fn show<Req: UnaryRequest>(out: Format, client: &CsiClient, req: Req) -> Result<(), Failure> {
    let resp = client.call(req).await?;
    let name = Req::METHOD.info().response;
    print!(
        "{}",
        with_newline(output::render(&output::dynamic(&resp, name), out))
    );
    Ok(())
}

mod node;

fn with_newline(mut s: String) -> String {
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(Failure(msg)) => {
            eprintln!("csi: {msg}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, Failure> {
    let secrets = cli.secrets.load().map_err(|e| Failure(e.to_string()))?;
    let endpoint: Endpoint = cli.endpoint.parse().map_err(|e| Failure(format!("{e}")))?;
    let options = ClientOptions {
        connect_timeout: Duration::from_secs(5),
        call_timeout: Some(Duration::from_secs(cli.timeout)),
    };
    let connect = || async {
        CsiClient::connect_with(endpoint.clone(), options.clone())
            .await
            .map_err(|e| Failure(e.to_string()))
    };
    let out = cli.output;
    match cli.command {
        Command::Identity(cmd) => identity(&connect().await?, cmd, out).await?,
        Command::Controller(cmd) => controller(&connect().await?, cmd, out, secrets).await?,
        Command::Node(cmd) => node::run(&connect().await?, cmd, out, secrets).await?,
        Command::Group(cmd) => group(&connect().await?, cmd, out, secrets).await?,
        Command::Bench(args) => {
            return bench::run(connect().await?, args, out, secrets)
                .await
                .map_err(Failure);
        }
        // The suite makes its own connections and reports an unreachable endpoint.
        Command::Sanity(args) => {
            return sanity::run(&cli.endpoint, args, secrets)
                .await
                .map_err(Failure);
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn identity(client: &CsiClient, cmd: IdentityCmd, out: Format) -> Result<(), Failure> {
    match cmd {
        IdentityCmd::Info => show!(out, client, GetPluginInfoRequest {}),
        IdentityCmd::Capabilities => show!(out, client, GetPluginCapabilitiesRequest {}),
        IdentityCmd::Probe => show!(out, client, ProbeRequest {}),
    }
    Ok(())
}

async fn controller(
    client: &CsiClient,
    cmd: ControllerCmd,
    out: Format,
    secrets: HashMap<String, String>,
) -> Result<(), Failure> {
    match cmd {
        ControllerCmd::CreateVolume {
            name,
            size,
            cap,
            params,
            mutable_params,
            from_snapshot,
            from_volume,
        } => {
            let source = match (from_snapshot, from_volume) {
                (Some(snapshot_id), _) => Some(volume_content_source::Type::Snapshot(
                    volume_content_source::SnapshotSource { snapshot_id },
                )),
                (None, Some(volume_id)) => Some(volume_content_source::Type::Volume(
                    volume_content_source::VolumeSource { volume_id },
                )),
                (None, None) => None,
            };
            let req = CreateVolumeRequest {
                name,
                capacity_range: size.range(),
                volume_capabilities: vec![cap.capability()],
                parameters: to_map(&params),
                secrets,
                volume_content_source: source.map(|t| VolumeContentSource { r#type: Some(t) }),
                accessibility_requirements: None,
                mutable_parameters: to_map(&mutable_params),
            };
            show!(out, client, req)
        }
        ControllerCmd::DeleteVolume { volume_id } => {
            show!(out, client, DeleteVolumeRequest { volume_id, secrets })
        }
        ControllerCmd::ListVolumes {
            max_entries: Some(max_entries),
            starting_token,
        } => show!(
            out,
            client,
            ListVolumesRequest {
                max_entries,
                starting_token
            }
        ),
        ControllerCmd::ListVolumes {
            max_entries: None,
            starting_token,
        } => {
            // Follow next_token and print one merged list.
            let mut all = ListVolumesResponse::default();
            let mut token = starting_token;
            loop {
                let page = client
                    .list_volumes(ListVolumesRequest {
                        max_entries: 0,
                        starting_token: token,
                    })
                    .await?;
                all.entries.extend(page.entries);
                if page.next_token.is_empty() {
                    break;
                }
                token = page.next_token;
            }
            print!(
                "{}",
                with_newline(output::render(
                    &output::dynamic(&all, Method::ListVolumes.info().response),
                    out
                ))
            );
        }
        ControllerCmd::GetVolume { volume_id } => {
            show!(out, client, ControllerGetVolumeRequest { volume_id })
        }
        ControllerCmd::ExpandVolume {
            volume_id,
            size,
            cap,
        } => show!(
            out,
            client,
            ControllerExpandVolumeRequest {
                volume_id,
                capacity_range: size.range(),
                secrets,
                volume_capability: Some(cap.capability()),
            }
        ),
        ControllerCmd::PublishVolume {
            volume_id,
            node,
            readonly,
            cap,
        } => show!(
            out,
            client,
            ControllerPublishVolumeRequest {
                volume_id,
                node_id: node,
                volume_capability: Some(cap.capability()),
                readonly,
                secrets,
                volume_context: HashMap::new(),
            }
        ),
        ControllerCmd::UnpublishVolume { volume_id, node } => show!(
            out,
            client,
            ControllerUnpublishVolumeRequest {
                volume_id,
                node_id: node,
                secrets
            }
        ),
        ControllerCmd::ValidateCapabilities { volume_id, cap } => show!(
            out,
            client,
            ValidateVolumeCapabilitiesRequest {
                volume_id,
                volume_capabilities: vec![cap.capability()],
                secrets,
                ..Default::default()
            }
        ),
        ControllerCmd::ModifyVolume {
            volume_id,
            mutable_params,
        } => show!(
            out,
            client,
            ControllerModifyVolumeRequest {
                volume_id,
                secrets,
                mutable_parameters: to_map(&mutable_params),
            }
        ),
        ControllerCmd::Capacity { params } => show!(
            out,
            client,
            GetCapacityRequest {
                parameters: to_map(&params),
                ..Default::default()
            }
        ),
        ControllerCmd::Capabilities => show!(out, client, ControllerGetCapabilitiesRequest {}),
        ControllerCmd::CreateSnapshot {
            name,
            source,
            params,
        } => show!(
            out,
            client,
            CreateSnapshotRequest {
                source_volume_id: source,
                name,
                secrets,
                parameters: to_map(&params),
            }
        ),
        ControllerCmd::DeleteSnapshot { snapshot_id } => show!(
            out,
            client,
            DeleteSnapshotRequest {
                snapshot_id,
                secrets
            }
        ),
        ControllerCmd::ListSnapshots {
            snapshot_id,
            source_volume_id,
            max_entries,
            starting_token,
        } => show!(
            out,
            client,
            ListSnapshotsRequest {
                max_entries,
                starting_token,
                source_volume_id,
                snapshot_id,
                secrets,
            }
        ),
        ControllerCmd::GetSnapshot { snapshot_id } => show!(
            out,
            client,
            GetSnapshotRequest {
                snapshot_id,
                secrets
            }
        ),
    }
    Ok(())
}

async fn group(
    client: &CsiClient,
    cmd: GroupCmd,
    out: Format,
    secrets: HashMap<String, String>,
) -> Result<(), Failure> {
    match cmd {
        GroupCmd::Capabilities => show!(out, client, GroupControllerGetCapabilitiesRequest {}),
        GroupCmd::Create {
            name,
            sources,
            params,
        } => show!(
            out,
            client,
            CreateVolumeGroupSnapshotRequest {
                name,
                source_volume_ids: sources,
                secrets,
                parameters: to_map(&params),
            }
        ),
        GroupCmd::Delete {
            group_snapshot_id,
            snapshot_ids,
        } => show!(
            out,
            client,
            DeleteVolumeGroupSnapshotRequest {
                group_snapshot_id,
                snapshot_ids,
                secrets,
            }
        ),
        GroupCmd::Get {
            group_snapshot_id,
            snapshot_ids,
        } => show!(
            out,
            client,
            GetVolumeGroupSnapshotRequest {
                group_snapshot_id,
                snapshot_ids,
                secrets
            }
        ),
    }
    Ok(())
}
