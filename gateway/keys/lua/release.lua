-- KEYS: per entry one key. ARGV: per entry kind, a, b.
--   tokens  a = capacity per minute, b = correction (positive: charge more, negative: give back)
--   slots   a = lease id
local now = now_us()
for i = 1, #KEYS do
  local kind, a, b = ARGV[i * 3 - 2], ARGV[i * 3 - 1], ARGV[i * 3]
  if kind == 'tokens' then
    local capacity = tonumber(a)
    bucket_store(KEYS[i], capacity, math.min(capacity, bucket_level(KEYS[i], capacity, now) - tonumber(b)), now)
  elseif kind == 'slots' then
    redis.call('ZREM', KEYS[i], a)
  end
end
return 1
