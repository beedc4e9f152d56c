//! Node-side mount toolbox for CSI plugins: safe mounts, bind mounts,
//! format-and-mount, resize, loop devices, mountinfo parsing, and a fake
//! mounter for unit tests.
