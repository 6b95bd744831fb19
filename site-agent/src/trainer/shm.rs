//! Tensors in shared memory: a file in the agent's shm directory that a
//! trainer names in a request, read into (or written from) the agent's
//! memory with one copy. Names are plain file names (no `/`, no leading
//! `.`), the file must be a regular file (not a symbolic link: it is opened
//! with `O_NOFOLLOW`) that already holds `offset + elements × size` bytes
//! and belongs to the user the request came from (the peer of the trainer
//! socket, from `SO_PEERCRED`; over TCP loopback, which carries no
//! credentials, the agent's own user): a trainer cannot have the agent
//! read or overwrite another user's file. The agent never creates or grows
//! a trainer's file.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::TrainerError;

#[cfg(target_endian = "big")]
compile_error!("the trainer API's tensors are little-endian; big-endian hosts are not supported");

/// Largest tensor a request may name: 2^28 values (1 GiB of f32), the
/// largest fragment the exchange carries.
pub const MAX_TENSOR_ELEMENTS: u64 = longhaul_core::scenario::MAX_EXCHANGE_ELEMENTS;
/// Longest file name.
pub const MAX_NAME_BYTES: usize = 255;

/// Not a symbolic link, and never blocking on open (a FIFO named as a
/// tensor would otherwise hold a thread until someone opened its other
/// end; it is then refused as not a regular file).
#[cfg(target_os = "linux")]
const NO_FOLLOW: i32 = nix::fcntl::OFlag::O_NOFOLLOW.bits() | nix::fcntl::OFlag::O_NONBLOCK.bits();
#[cfg(not(target_os = "linux"))]
const NO_FOLLOW: i32 = 0;

/// The agent's own user: whom a request over TCP loopback speaks for.
pub fn own_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Element types a tensor may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    Bf16,
}

impl Dtype {
    pub fn size(self) -> u64 {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
        }
    }
}

/// A tensor a request names, checked for its form (not yet for its file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorRef {
    pub name: String,
    pub offset: u64,
    pub dtype: Dtype,
    pub elements: u64,
}

impl TensorRef {
    /// The tensor `message` names, as the request field `field`.
    pub fn from_wire(
        message: Option<&longhaul_proto::v1::SharedTensor>,
        field: &'static str,
    ) -> Result<TensorRef, TrainerError> {
        use longhaul_proto::v1::TensorDtype;
        let invalid = |message: String| TrainerError::Invalid { field, message };
        let Some(message) = message else {
            return Err(invalid("is missing".into()));
        };
        let name = &message.name;
        if name.is_empty()
            || name.len() > MAX_NAME_BYTES
            || name.starts_with('.')
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err(invalid(format!(
                "name {:?} must be a plain file name of 1 to {MAX_NAME_BYTES} letters, digits, '.', '_' or '-', not starting with '.'",
                super::prefix(name)
            )));
        }
        let dtype = match TensorDtype::try_from(message.dtype) {
            Ok(TensorDtype::F32) => Dtype::F32,
            Ok(TensorDtype::Bf16) => Dtype::Bf16,
            _ => {
                return Err(invalid(format!(
                    "dtype {} is not one of F32 (1) or BF16 (2)",
                    message.dtype
                )));
            }
        };
        if !(1..=MAX_TENSOR_ELEMENTS).contains(&message.elements) {
            return Err(invalid(format!(
                "elements is {}; it must be between 1 and {MAX_TENSOR_ELEMENTS}",
                message.elements
            )));
        }
        Ok(TensorRef {
            name: name.clone(),
            offset: message.offset,
            dtype,
            elements: message.elements,
        })
    }

    fn bytes(&self) -> u64 {
        self.elements * self.dtype.size()
    }
}

/// The directory trainers' tensors live in.
#[derive(Debug, Clone)]
pub struct ShmDir {
    dir: PathBuf,
}

impl ShmDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn open(
        &self,
        tensor: &TensorRef,
        write: bool,
        field: &'static str,
        owner: u32,
    ) -> Result<File, TrainerError> {
        let path = self.dir.join(&tensor.name);
        let file = OpenOptions::new()
            .read(!write)
            .write(write)
            .custom_flags(NO_FOLLOW)
            .open(&path)
            .map_err(|error| TrainerError::Invalid {
                field,
                message: format!("cannot open {}: {error}", path.display()),
            })?;
        let meta = file.metadata().map_err(|error| TrainerError::Invalid {
            field,
            message: format!("cannot stat {}: {error}", path.display()),
        })?;
        if !meta.is_file() {
            return Err(TrainerError::Invalid {
                field,
                message: format!("{} is not a regular file", path.display()),
            });
        }
        if meta.uid() != owner {
            return Err(TrainerError::Invalid {
                field,
                message: format!(
                    "{} belongs to uid {}, not to the caller's uid {owner}: a trainer names only its own files",
                    path.display(),
                    meta.uid()
                ),
            });
        }
        let end = tensor.offset.checked_add(tensor.bytes());
        if end.is_none_or(|end| end > meta.len()) {
            return Err(TrainerError::Invalid {
                field,
                message: format!(
                    "{} holds {} bytes; {} {:?} values at offset {} need {}",
                    path.display(),
                    meta.len(),
                    tensor.elements,
                    tensor.dtype,
                    tensor.offset,
                    end.map_or_else(|| "more than 2^64".to_string(), |e| e.to_string()),
                ),
            });
        }
        Ok(file)
    }

    /// The tensor's values as f32 (bf16 widened exactly), from a file of
    /// user `owner`.
    pub fn read(
        &self,
        tensor: &TensorRef,
        field: &'static str,
        owner: u32,
    ) -> Result<Vec<f32>, TrainerError> {
        self.read_into(tensor, field, Vec::new(), owner)
    }

    /// [`ShmDir::read`] into `buffer`'s memory when it has the tensor's
    /// size: a buffer used before is not faulted in page by page again,
    /// which halves the read of a large fragment.
    pub fn read_into(
        &self,
        tensor: &TensorRef,
        field: &'static str,
        buffer: Vec<f32>,
        owner: u32,
    ) -> Result<Vec<f32>, TrainerError> {
        let file = self.open(tensor, false, field, owner)?;
        let io = |error: std::io::Error| TrainerError::Invalid {
            field,
            message: format!("cannot read {}: {error}", tensor.name),
        };
        let n = tensor.elements as usize;
        match tensor.dtype {
            Dtype::F32 => {
                let mut values = if buffer.len() == n {
                    buffer
                } else {
                    vec![0f32; n]
                };
                file.read_exact_at(bytemuck::cast_slice_mut(&mut values), tensor.offset)
                    .map_err(io)?;
                Ok(values)
            }
            Dtype::Bf16 => {
                let mut halves = vec![0u16; n];
                file.read_exact_at(bytemuck::cast_slice_mut(&mut halves), tensor.offset)
                    .map_err(io)?;
                Ok(halves
                    .into_iter()
                    .map(|h| f32::from_bits(u32::from(h) << 16))
                    .collect())
            }
        }
    }

    /// Writes `values` into the tensor (bf16 rounded to nearest even), a
    /// file of user `owner`.
    pub fn write(
        &self,
        tensor: &TensorRef,
        values: &[f32],
        field: &'static str,
        owner: u32,
    ) -> Result<(), TrainerError> {
        if values.len() as u64 != tensor.elements {
            return Err(TrainerError::Invalid {
                field,
                message: format!(
                    "elements is {}; the result has {}",
                    tensor.elements,
                    values.len()
                ),
            });
        }
        let file = self.open(tensor, true, field, owner)?;
        let io = |error: std::io::Error| TrainerError::Invalid {
            field,
            message: format!("cannot write {}: {error}", tensor.name),
        };
        match tensor.dtype {
            Dtype::F32 => file
                .write_all_at(bytemuck::cast_slice(values), tensor.offset)
                .map_err(io),
            Dtype::Bf16 => {
                let halves: Vec<u16> = values.iter().map(|v| bf16_bits(*v)).collect();
                file.write_all_at(bytemuck::cast_slice(&halves), tensor.offset)
                    .map_err(io)
            }
        }
    }
}

/// `value` rounded to the nearest bf16 (ties to even); NaN stays NaN.
fn bf16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    if value.is_nan() {
        return ((bits >> 16) as u16) | 0x40;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use longhaul_proto::v1 as pb;

    fn wire(name: &str, offset: u64, dtype: pb::TensorDtype, elements: u64) -> pb::SharedTensor {
        pb::SharedTensor {
            name: name.into(),
            offset,
            dtype: dtype as i32,
            elements,
        }
    }

    #[test]
    fn a_tensor_reference_is_checked_and_names_its_field() {
        for (tensor, needle) in [
            (wire("../etc/passwd", 0, pb::TensorDtype::F32, 4), "name"),
            (wire("a/b", 0, pb::TensorDtype::F32, 4), "name"),
            (wire(".hidden", 0, pb::TensorDtype::F32, 4), "name"),
            (wire("", 0, pb::TensorDtype::F32, 4), "name"),
            (wire("t", 0, pb::TensorDtype::Unspecified, 4), "dtype"),
            (wire("t", 0, pb::TensorDtype::F32, 0), "elements"),
            (
                wire("t", 0, pb::TensorDtype::F32, MAX_TENSOR_ELEMENTS + 1),
                "elements",
            ),
        ] {
            let error = TensorRef::from_wire(Some(&tensor), "tensor").unwrap_err();
            let text = error.to_string();
            assert!(text.starts_with("tensor: "), "{text}");
            assert!(text.contains(needle), "{text}");
        }
        assert!(TensorRef::from_wire(None, "into").is_err());
    }

    #[test]
    fn values_go_through_a_file_both_ways_in_both_dtypes() {
        let dir = tempfile::tempdir().unwrap();
        let shm = ShmDir::new(dir.path());
        let values: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) / 7.0).collect();
        std::fs::write(dir.path().join("t"), vec![0u8; 16 + 4000]).unwrap();
        let f32_at_16 = TensorRef {
            name: "t".into(),
            offset: 16,
            dtype: Dtype::F32,
            elements: 1000,
        };
        shm.write(&f32_at_16, &values, "into", own_uid()).unwrap();
        assert_eq!(shm.read(&f32_at_16, "tensor", own_uid()).unwrap(), values);
        let bf16 = TensorRef {
            dtype: Dtype::Bf16,
            offset: 0,
            ..f32_at_16.clone()
        };
        shm.write(&bf16, &values, "into", own_uid()).unwrap();
        let back = shm.read(&bf16, "tensor", own_uid()).unwrap();
        for (a, b) in values.iter().zip(&back) {
            assert!((a - b).abs() <= a.abs() / 256.0, "{a} {b}");
        }
        // Exact for values bf16 holds.
        assert_eq!(bf16_bits(1.5), 0x3fc0);
        assert_eq!(f32::from_bits(u32::from(bf16_bits(-2.0)) << 16), -2.0);
    }

    #[test]
    fn a_file_too_short_a_link_or_a_directory_is_refused_and_nothing_written() {
        let dir = tempfile::tempdir().unwrap();
        let shm = ShmDir::new(dir.path());
        std::fs::write(dir.path().join("short"), vec![7u8; 100]).unwrap();
        let tensor = TensorRef {
            name: "short".into(),
            offset: 0,
            dtype: Dtype::F32,
            elements: 26,
        };
        let error = shm
            .write(&tensor, &[0.0; 26], "into", own_uid())
            .unwrap_err();
        assert!(error.to_string().contains("holds 100 bytes"), "{error}");
        assert_eq!(
            std::fs::read(dir.path().join("short")).unwrap(),
            vec![7u8; 100]
        );
        let error = shm
            .read(
                &TensorRef {
                    offset: u64::MAX,
                    ..tensor.clone()
                },
                "tensor",
                own_uid(),
            )
            .unwrap_err();
        assert!(error.to_string().contains("2^64"), "{error}");
        std::os::unix::fs::symlink(dir.path().join("short"), dir.path().join("link")).unwrap();
        let link = TensorRef {
            name: "link".into(),
            elements: 1,
            ..tensor.clone()
        };
        assert!(shm.read(&link, "tensor", own_uid()).is_err());
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let directory = TensorRef {
            name: "d".into(),
            ..link
        };
        assert!(shm.read(&directory, "tensor", own_uid()).is_err());
        // A FIFO is refused at once, not waited on.
        let fifo = dir.path().join("fifo");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let error = shm
            .read(
                &TensorRef {
                    name: "fifo".into(),
                    ..tensor.clone()
                },
                "tensor",
                own_uid(),
            )
            .unwrap_err();
        assert!(error.to_string().contains("not a regular file"), "{error}");
        let missing = TensorRef {
            name: "missing".into(),
            ..tensor
        };
        assert!(
            shm.read(&missing, "tensor", own_uid())
                .unwrap_err()
                .to_string()
                .contains("cannot open")
        );
    }

    #[test]
    fn a_file_of_another_user_is_neither_read_nor_written() {
        let dir = tempfile::tempdir().unwrap();
        let shm = ShmDir::new(dir.path());
        std::fs::write(dir.path().join("theirs"), vec![7u8; 16]).unwrap();
        let tensor = TensorRef {
            name: "theirs".into(),
            offset: 0,
            dtype: Dtype::F32,
            elements: 4,
        };
        // The file is this process's; the caller is someone else.
        let caller = own_uid().wrapping_add(1);
        let error = shm.write(&tensor, &[1.0; 4], "into", caller).unwrap_err();
        assert!(
            error.to_string().starts_with("into: ")
                && error.to_string().contains(&format!(
                    "belongs to uid {}, not to the caller's uid {caller}",
                    own_uid()
                )),
            "{error}"
        );
        assert_eq!(
            std::fs::read(dir.path().join("theirs")).unwrap(),
            vec![7u8; 16]
        );
        let error = shm.read(&tensor, "tensor", caller).unwrap_err();
        assert!(error.to_string().contains("belongs to uid"), "{error}");
        assert_eq!(shm.read(&tensor, "tensor", own_uid()).unwrap().len(), 4);
    }
}
