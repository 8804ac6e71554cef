// NIC choice for a GPU on a synthetic two-socket host: PCIe switch first, NUMA node second.
#include "kvnode/gpu/nic_affinity.hpp"

#include <gtest/gtest.h>

namespace kvnode::gpu {
namespace {

// Socket 0: root port 3a, a switch 3b with the GPU (3c) and mlx5_0 (3d) behind it, and mlx5_1
// on its own root port 17. Socket 1: mlx5_2 under root complex d7.
const std::string kGpu =
    "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3b:08.0/0000:3c:00.0";
const RdmaDevice kSameSwitch{
    "mlx5_0", "guid0", 0,
    "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/0000:3b:10.0/0000:3d:00.0"};
const RdmaDevice kSameSocket{"mlx5_1", "guid1", 0,
                             "/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0"};
const RdmaDevice kOtherSocket{"mlx5_2", "guid2", 1,
                              "/sys/devices/pci0000:d7/0000:d7:00.0/0000:d8:00.0"};

TEST(NicAffinity, TheNicUnderTheGpusSwitchWins) {
  EXPECT_EQ(pci_distance_score(kGpu, kSameSwitch.pci_path), 3);
  EXPECT_EQ(pci_distance_score(kGpu, kOtherSocket.pci_path), 0);
  const auto nic = nearest_nic({kOtherSocket, kSameSocket, kSameSwitch}, kGpu, 0);
  ASSERT_TRUE(nic);
  EXPECT_EQ(nic->name, "mlx5_0");
  EXPECT_EQ(ucx_net_device(*nic), "mlx5_0:1");
}

TEST(NicAffinity, WithoutAPathTheNumaNodeDecidesThenListOrder) {
  auto nic = nearest_nic({kSameSocket, kOtherSocket}, "", 1);  // host memory on socket 1
  ASSERT_TRUE(nic);
  EXPECT_EQ(nic->name, "mlx5_2");
  nic = nearest_nic({kSameSocket, kOtherSocket}, "", -1);
  ASSERT_TRUE(nic);
  EXPECT_EQ(nic->name, "mlx5_1");
  EXPECT_FALSE(nearest_nic({}, kGpu, 0));
}

TEST(NicAffinity, SysfsPathOfAMissingDeviceIsEmpty) {
  EXPECT_EQ(pci_sysfs_path("ffff:ff:1f.7"), "");
}

}  // namespace
}  // namespace kvnode::gpu
