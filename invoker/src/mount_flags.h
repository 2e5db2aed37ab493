// Mount flags a remount must pass again to keep them.
#ifndef SILT_INVOKER_MOUNT_FLAGS_H_
#define SILT_INVOKER_MOUNT_FLAGS_H_

#include <sys/mount.h>
#include <sys/statvfs.h>

namespace silt::invoker {

// A mount's nosuid, nodev, noexec and atime flags (statvfs) as mount(2)
// flags: what a remount must pass again to keep them.
inline unsigned long KeptMountFlags(const struct statvfs& st) {
  unsigned long flags = 0;
  if (st.f_flag & ST_NOSUID) flags |= MS_NOSUID;
  if (st.f_flag & ST_NODEV) flags |= MS_NODEV;
  if (st.f_flag & ST_NOEXEC) flags |= MS_NOEXEC;
  if (st.f_flag & ST_NOATIME) flags |= MS_NOATIME;
  if (st.f_flag & ST_NODIRATIME) flags |= MS_NODIRATIME;
  if (st.f_flag & ST_RELATIME) flags |= MS_RELATIME;
  return flags;
}

}  // namespace silt::invoker

#endif  // SILT_INVOKER_MOUNT_FLAGS_H_
